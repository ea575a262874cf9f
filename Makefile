# muon -- build, test, demo. See README.md.
#   make            build build/libmuon.so (SONAME libmuon.so.0), build/libmuon.a
#   make deps       install missing Debian packages (as root) or print the command
#   make test       deps + build + every test; last line "N passed, N failed"
#   make abi-baseline   rewrite src/abi/libmuon.abi (only with a SONAME bump, see below)
#   make demo       deps + build + the main job
#   make bench      benchmarks (tests/bench)
#   make install / make uninstall   [PREFIX=/usr/local] [DESTDIR=]

PKGS     := pkg-config libluajit-5.1-dev luajit libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin lua-busted lua-cjson wamerican valgrind \
            abigail-tools
# The Python package (src/libmuon) and its tests: cffi and NumPy; torch and mpi4py for their tests.
PKGS     += python3-cffi python3-numpy python3-torch python3-mpi4py
PKGCONF  := luajit openblas
# Open MPI when present (Debian: libopenmpi-dev); else the single-process
# communicator backend is built.
HAVE_MPI := $(shell pkg-config --exists ompi-c 2>/dev/null && echo 1)
ifeq ($(HAVE_MPI),1)
PKGCONF  += ompi-c
MPIFLAG  := -DMU_HAVE_MPI
endif
CC       ?= cc
# SAN=1 (ASan + UBSan) and TSAN=1 (ThreadSanitizer) build into their own
# trees so objects never mix.
BUILD    := $(if $(filter 1,$(SAN)),build-san,$(if $(filter 1,$(TSAN)),build-tsan,build))
OPT      ?= -O2
CFLAGS   ?= $(OPT) -g
CFLAGS   += -std=c11 -Wall -Wextra -fPIC -fvisibility=hidden -D_POSIX_C_SOURCE=200809L -DMU_BUILDING $(MPIFLAG)
DEPCFLAGS = $(shell pkg-config --cflags $(PKGCONF) 2>/dev/null)
DEPLIBS   = $(shell pkg-config --libs $(PKGCONF) 2>/dev/null) -lm -lpthread
ifeq ($(SAN),1)
CFLAGS   += -fsanitize=address,undefined -fno-omit-frame-pointer
LDSAN    := -fsanitize=address,undefined
endif
ifeq ($(TSAN),1)
CFLAGS   += -fsanitize=thread -fno-omit-frame-pointer
LDSAN    := -fsanitize=thread
endif

SRCS     := $(wildcard src/*.c)
OBJS     := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(SRCS))
# The shared library is versioned: the file libmuon.so.<version>, its SONAME
# libmuon.so.<major> (what programs record and load), and libmuon.so, the
# link-time name; the last two are symlinks (built and installed alike).
VERSION  := $(shell sed -n 's/.*mu_version(void) { return "\([^"]*\)".*/\1/p' src/cdef.c)
SOMAJOR  := $(firstword $(subst ., ,$(VERSION)))
SONAME   := libmuon.so.$(SOMAJOR)
LIB_REAL := $(BUILD)/libmuon.so.$(VERSION)
LIB_SO   := $(BUILD)/libmuon.so
LIB_A    := $(BUILD)/libmuon.a
# The CPU probe: the OpenBLAS core table (src/blas_core.c) and the status
# codes, needing nothing but libc, so a host can load and ask it before
# libmuon and OpenBLAS (mu_blas_preset_core in src/muon.h).
PROBE    := $(BUILD)/libmuon-cpu.so
PROBE_OBJS := $(BUILD)/obj/blas_core.o $(BUILD)/obj/error.o
CDEF     := $(BUILD)/gen/cdef.inc
# The symbol versions (src/libmuon.map): muon.h's functions under MUON_0,
# muon_ffi.h's under MUON_PRIVATE, nothing else exported.
MAP      := src/libmuon.map
# The installed header alone (a copy of src/muon.h), for the hosts.
PUBINC   := $(BUILD)/include
# The Python package's declarations: the public header run through the
# preprocessor (src/libmuon/_lib.py hands them to cffi).
PYCDEF   := $(BUILD)/gen/muon_cdef.h
# Debian's python3 (torch and mpi4py are Debian packages), else the PATH's.
PYTHON   ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)

# C test programs (tests/c/*.c -> build/tests/*), each printing TAP lines.
CTESTS   := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(wildcard tests/c/*.c))
# Host programs: the CLI (src/cli/) and the examples' C trainers.
CLI      := $(BUILD)/muon
CLI_SRCS := $(wildcard src/cli/*.c)
EXAMPLES := $(patsubst examples/%.c,$(BUILD)/examples/%,$(wildcard examples/*.c))
# Hosts link the static library and export its symbols so that Lua code
# running inside them finds the API through ffi.C.
HOSTLINK  = -Wl,--whole-archive $(LIB_A) -Wl,--no-whole-archive -Wl,--export-dynamic $(LDSAN) $(DEPLIBS)

.PHONY: all deps test demo bench clean install uninstall fuzz reference abi-baseline
all: $(LIB_SO) $(LIB_A) $(PROBE) $(if $(CLI_SRCS),$(CLI)) $(CTESTS) $(EXAMPLES) $(PYCDEF)

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

# The FFI declarations are the private header, which includes the public
# one, run through the preprocessor (MU_FFI_CDEF drops system includes and
# macros), embedded as a string: mu_cdef().
$(CDEF): src/muon_ffi.h src/muon.h
	@mkdir -p $(dir $@)
	$(CC) -E -P -DMU_FFI_CDEF src/muon_ffi.h | grep -v '^[[:space:]]*$$' \
	  | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/"/' -e 's/$$/\\n"/' > $@.tmp && mv $@.tmp $@

$(PYCDEF): src/muon.h
	@mkdir -p $(dir $@)
	$(CC) -E -P -DMU_FFI_CDEF src/muon.h | grep -v '^[[:space:]]*$$' > $@.tmp && mv $@.tmp $@

$(BUILD)/obj/%.o: src/%.c $(wildcard src/*.h) | $(CDEF)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPCFLAGS) -I$(BUILD)/gen -Isrc -c $< -o $@

$(BUILD)/obj/cdef.o: $(CDEF)

# The tensor-maths kernels are vector loops where the compiler may check at
# run time that in-place operands alias exactly (GCC's -O2 "very cheap"
# cost model refuses such checks); results are the same IEEE operations.
# (Only for compilers that take the flag: clang does not.)
VECTFLAG := $(shell $(CC) -fvect-cost-model=dynamic -E -x c /dev/null >/dev/null 2>&1 && echo -fvect-cost-model=dynamic)
$(BUILD)/obj/tensor_math.o: CFLAGS += $(VECTFLAG)

$(LIB_REAL): $(OBJS) $(MAP)
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=$(MAP) -o $@ $(OBJS) $(LDSAN) $(DEPLIBS)

$(PROBE): $(PROBE_OBJS) $(MAP)
	$(CC) -shared -Wl,-soname,libmuon-cpu.so -Wl,--version-script=$(MAP) -o $@ $(PROBE_OBJS) $(LDSAN)

# What a host sees once muon is installed: the public header alone. The
# CLI and the examples build against this copy, so that they cannot use
# the private surface.
$(PUBINC)/muon.h: src/muon.h
	@mkdir -p $(dir $@)
	cp src/muon.h $@

$(LIB_SO): $(LIB_REAL)
	ln -sf $(notdir $(LIB_REAL)) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $@

$(LIB_A): $(OBJS)
	rm -f $@ && ar rcs $@ $(OBJS)

$(BUILD)/tests/%: tests/c/%.c tests/c/tap.h $(LIB_A) src/muon.h src/muon_ffi.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPCFLAGS) -Isrc -o $@ $< $(HOSTLINK)

$(CLI): $(CLI_SRCS) $(LIB_A) $(PUBINC)/muon.h
	$(CC) $(CFLAGS) $(DEPCFLAGS) -I$(PUBINC) -o $@ $(CLI_SRCS) $(HOSTLINK)

$(BUILD)/examples/%: examples/%.c $(LIB_A) $(PUBINC)/muon.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPCFLAGS) -I$(PUBINC) -o $@ $< $(HOSTLINK)

# Newton-Schulz in an OpenMP host: this C test is built with OpenMP.
$(BUILD)/tests/ns_openmp_test: CFLAGS += -fopenmp

# The OpenMP host benchmark (tests/bench/omp_bench.lua builds it on demand).
$(BUILD)/bench/omp_host: tests/bench/omp_host.c $(LIB_A) $(PUBINC)/muon.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fopenmp $(DEPCFLAGS) -I$(PUBINC) -o $@ $< $(HOSTLINK) -fopenmp

# The C side of the Python-against-C step benchmark (tests/bench/python_bench.lua).
$(BUILD)/bench/step_host: tests/bench/step_host.c $(LIB_A) $(PUBINC)/muon.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPCFLAGS) -I$(PUBINC) -o $@ $< $(HOSTLINK)

# The Newton-Schulz roof benchmark (tests/bench/ns_roof_bench.lua builds it
# on demand): oneDNN linked for its bf16 matmul rate.
$(BUILD)/bench/ns_roof: tests/bench/ns_roof.c $(LIB_A) src/muon.h src/muon_ffi.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPCFLAGS) -Isrc -o $@ $< $(HOSTLINK) -ldnnl

# test, demo and bench re-run make after deps: variables such as HAVE_MPI are
# read when make starts, which on a fresh machine is before deps installed
# the packages they look for.
# make test SAN=1: the whole suite on the ASan+UBSan build (build-san/);
# make test VALGRIND=1: the C embedding tests under valgrind as well;
# make test TSAN=1: the C tests that run threads, on a ThreadSanitizer build
# (build-tsan/).
test: deps
	@$(MAKE) --no-print-directory all
	@MUON_BUILD=$(BUILD) SAN=$(SAN) TSAN=$(TSAN) VALGRIND=$(VALGRIND) PYTHON=$(PYTHON) bash tests/run.sh

# build/REFERENCE.md: the API reference, generated from the reference blocks
# at the top of the Lua modules and the comments of src/muon.h (the same
# text `muon help API` prints; lua/muon/reference.lua reads both).
reference: all
	$(BUILD)/muon help API --markdown $(BUILD)/REFERENCE.md

# The ABI of the public API (src/muon.h's functions and the types they
# reach; libabigail, Debian abigail-tools), from the normal build: make test
# compares build/libmuon.so with src/abi/libmuon.abi (tests/abi_spec.lua
# through tests/abi/abi.sh) and fails on an incompatible change. The SONAME
# rule: an incompatible change to muon.h (a function removed or its
# signature changed, a public struct's layout changed) bumps the major
# version in src/cdef.c (SONAME libmuon.so.N+1, symbol node MUON_N+1 in
# src/libmuon.map) and only then is the baseline rewritten with this target;
# a compatible addition (a new function) bumps the minor version and
# leaves the baseline as it is.
abi-baseline:
	@if [ "$(BUILD)" != build ]; then echo "make abi-baseline: from the normal build only (no SAN=1, TSAN=1)"; exit 1; fi
	@$(MAKE) --no-print-directory all
	@mkdir -p src/abi
	bash tests/abi/abi.sh dump $(LIB_SO) src/muon.h > src/abi/libmuon.abi.tmp && mv src/abi/libmuon.abi.tmp src/abi/libmuon.abi

# make fuzz [FUZZ_SECONDS=60] [FUZZ_TARGETS="npy safetensors config"]:
# libFuzzer harnesses (tests/fuzz/) built with clang into build/fuzz/.
FUZZ_PKGS := clang-14 libclang-rt-14-dev
FUZZ_SECONDS ?= 60
fuzz: deps
	@$(MAKE) --no-print-directory deps PKGS="$(FUZZ_PKGS)"
	@$(MAKE) --no-print-directory all
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash tests/fuzz/run.sh

# The demo: a C trainer (examples/demo_trainer.c) trains a character-level
# model twice (configs/muon.lua, configs/adamw.lua); writes build/demo/.
demo: deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/examples/demo_trainer --out $(BUILD)/demo

# make install [PREFIX=/usr/local] [DESTDIR=]: library (the versioned file
# and its two symlinks), header, Lua modules, CLI, shipped configs and a
# pkg-config file, so that an out-of-tree trainer builds with
#   cc trainer.c $$(pkg-config --cflags --libs muon)
# DESTDIR stages the files under $(DESTDIR)$(PREFIX) (packaging); the paths
# written into muon.pc are $(PREFIX)'s. make uninstall removes exactly these
# files, then the directories that are left empty: muon's own always, the
# standard ones (lib, bin, include, share, ...) only under a DESTDIR.
PREFIX   ?= /usr/local
INSTALL_FILES := lib/libmuon.a lib/libmuon.so.$(VERSION) lib/$(SONAME) lib/libmuon.so lib/libmuon-cpu.so \
                 include/muon.h bin/muon lib/pkgconfig/muon.pc
# The Python package goes to PYDIR (Debian's python3 reads /usr/local's
# dist-packages and ~/.local's site-packages; PYDIR= to choose).
PYVER    := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
PYDIR    ?= $(if $(filter /usr,$(PREFIX)),/usr/lib/python3/dist-packages,$(PREFIX)/lib/python$(PYVER)/$(if $(filter /usr/local,$(PREFIX)),dist-packages,site-packages))
install: all
	@set -e; d="$(DESTDIR)$(PREFIX)"; \
	install -d "$$d/lib/pkgconfig" "$$d/include" "$$d/bin" "$$d/share/lua/5.1"; \
	install -m 644 $(LIB_A) "$$d/lib/libmuon.a"; \
	install -m 755 $(LIB_REAL) "$$d/lib/libmuon.so.$(VERSION)"; \
	ln -sf libmuon.so.$(VERSION) "$$d/lib/$(SONAME)"; \
	ln -sf $(SONAME) "$$d/lib/libmuon.so"; \
	install -m 755 $(PROBE) "$$d/lib/libmuon-cpu.so"; \
	install -m 644 src/muon.h "$$d/include/muon.h"; \
	install -m 755 $(CLI) "$$d/bin/muon"; \
	for f in $$(cd lua && find muon -name '*.lua' | sort); do \
	  install -D -m 644 "lua/$$f" "$$d/share/lua/5.1/$$f"; \
	done; \
	for f in configs/*.lua; do install -D -m 644 "$$f" "$$d/share/muon/$$f"; done; \
	printf '%s\n' 'prefix=$(PREFIX)' 'exec_prefix=$${prefix}' 'libdir=$${exec_prefix}/lib' \
	  'includedir=$${prefix}/include' 'luadir=$${prefix}/share/lua/5.1' '' \
	  'Name: muon' 'Description: Muon optimizer engine (C core, LuaJIT configs and hooks)' \
	  'Version: $(VERSION)' 'Requires.private: $(PKGCONF)' 'Cflags: -I$${includedir}' \
	  'Libs: -L$${libdir} -Wl,-rpath,$${libdir} -lmuon' 'Libs.private: -lm -lpthread' \
	  > "$$d/lib/pkgconfig/muon.pc"; \
	if [ -n "$(PYVER)" ]; then p="$(DESTDIR)$(PYDIR)/libmuon"; install -d "$$p"; \
	  install -m 644 src/libmuon/*.py $(PYCDEF) "$$p"; printf 'LIBDIR = "%s"\n' '$(PREFIX)/lib' > "$$p/_paths.py"; \
	  echo "installed the Python package libmuon into $(DESTDIR)$(PYDIR)"; fi; \
	echo "installed muon $(VERSION) into $$d (pkg-config: $$d/lib/pkgconfig/muon.pc)"

uninstall:
	@set -e; d="$(DESTDIR)$(PREFIX)"; \
	for f in $(INSTALL_FILES); do rm -f "$$d/$$f"; done; \
	rm -rf "$$d/share/lua/5.1/muon" "$$d/share/muon"; \
	rm -rf "$(DESTDIR)$(PYDIR)/libmuon"; \
	for x in lib/pkgconfig share/lua/5.1 share/lua; do rmdir "$$d/$$x" 2>/dev/null || true; done; \
	if [ -n "$(DESTDIR)" ]; then \
	  rmdir "$(DESTDIR)$(PYDIR)" "$$(dirname "$(DESTDIR)$(PYDIR)")" 2>/dev/null || true; \
	  for x in lib include bin share; do rmdir "$$d/$$x" 2>/dev/null || true; done; \
	  p="$(PREFIX)"; while [ -n "$$p" ] && [ "$$p" != / ]; do \
	    rmdir "$(DESTDIR)$$p" 2>/dev/null || true; p=$$(dirname "$$p"); \
	  done; \
	fi; \
	echo "uninstalled muon from $$d"

# The benchmarks compare against the seed's PyTorch code: Debian's torch
# (and numpy) are installed for them, never needed by the build or tests.
BENCH_PKGS := python3-torch python3-numpy
bench: deps
	@$(MAKE) --no-print-directory deps PKGS="$(BENCH_PKGS)" || echo "make bench: without torch the seed comparison is skipped"
	@$(MAKE) --no-print-directory all
	@bash tests/bench/run.sh

clean:
	rm -rf $(BUILD)
