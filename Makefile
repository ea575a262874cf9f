# muon -- build, test, demo. See README.md.
#   make            build build/libmuon.so, build/libmuon.a
#   make deps       install missing Debian packages (as root) or print the command
#   make test       deps + build + every test; last line "N passed, N failed"
#   make demo       deps + build + the main job
#   make bench      benchmarks (tests/bench)

PKGS     := libluajit-5.1-dev luajit libopenblas-dev libopenmpi-dev openmpi-bin lua-busted lua-cjson wamerican
PKGCONF  := luajit openblas
CC       ?= cc
BUILD    := build
OPT      ?= -O2
CFLAGS   ?= $(OPT) -g
CFLAGS   += -std=c11 -Wall -Wextra -fPIC -fvisibility=hidden -D_POSIX_C_SOURCE=200809L -DMU_BUILDING
DEPCFLAGS = $(shell pkg-config --cflags $(PKGCONF) 2>/dev/null)
DEPLIBS   = $(shell pkg-config --libs $(PKGCONF) 2>/dev/null) -lm -lpthread
ifeq ($(SAN),1)
CFLAGS   += -fsanitize=address,undefined -fno-omit-frame-pointer
LDSAN    := -fsanitize=address,undefined
endif

SRCS     := $(wildcard src/*.c)
OBJS     := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(SRCS))
LIB_SO   := $(BUILD)/libmuon.so
LIB_A    := $(BUILD)/libmuon.a
CDEF     := $(BUILD)/gen/cdef.inc

.PHONY: all deps test demo bench clean
all: $(LIB_SO) $(LIB_A)

deps:
	@missing=""; for p in $(PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  echo "make deps: installing$$missing"; \
	  (apt-get install -y $$missing || (apt-get update && apt-get install -y $$missing)) >&2 || exit 1; \
	else \
	  echo "make deps: missing packages; run as root:"; \
	  echo "  apt-get update && apt-get install -y$$missing"; exit 1; \
	fi

# The FFI declarations are the public header run through the preprocessor
# (MU_FFI_CDEF drops includes and macros), embedded as a string: mu_cdef().
$(CDEF): src/muon.h
	@mkdir -p $(dir $@)
	$(CC) -E -P -DMU_FFI_CDEF src/muon.h | grep -v '^[[:space:]]*$$' \
	  | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' > $@.tmp && mv $@.tmp $@

$(BUILD)/obj/%.o: src/%.c src/muon.h $(wildcard src/*_internal.h) | $(CDEF)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPCFLAGS) -I$(BUILD)/gen -Isrc -c $< -o $@

$(BUILD)/obj/cdef.o: $(CDEF)

$(LIB_SO): $(OBJS)
	$(CC) -shared -o $@ $(OBJS) $(LDSAN) $(DEPLIBS)

$(LIB_A): $(OBJS)
	rm -f $@ && ar rcs $@ $(OBJS)

test: deps all
	@bash tests/run.sh

demo: deps all
	@echo "make demo: the demo trainer lands with issue 5; not yet."

bench: deps all
	@bash tests/bench/run.sh

clean:
	rm -rf $(BUILD)
