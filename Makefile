# dsv4 build. Every .c under src/ (except src/cli) goes into libdsv4.a; src/cli/*.c is the dsv4 binary;
# every tests/unit/test_*.c is its own test program linked against the library; every tests/fuzz/fuzz_*.c is a
# fuzz target, built as a replay program in every build and as a libFuzzer program by `make fuzz`.
# Adding a file needs no edit here.
#
# `make CUDA=1` adds the CUDA backend (src/backend/cuda/*.cu, nvcc for sm_90a, the CUDA runtime linked
# statically) in its own folder, build-cuda/, with the GPU test programs (tests/gpu/test_*.c). `make test-gpu`
# builds it and runs the GPU suite on a machine with a GPU. STATIC_DEPS=1 links jansson, PCRE2 and xxhash
# statically (binaries for a machine without those libraries).

CC      ?= cc
CUDA    ?= 0
ifeq ($(CUDA),1)
BUILD   ?= build-cuda
else
BUILD   ?= build
endif
OPT     ?= -O3 -march=native
SAN     ?=
# -ffp-contract=off: the only FMAs are the ones the code writes (fmaf). GCC's default in GNU C fuses a * b + c where
# its passes happen to see one (a loop's vector body and its scalar remainder could differ), so the CPU's bits
# depended on -O, -march and the compiler's version; now they are the source's (tests/cli/bits_across_builds.sh).
CFLAGS  += -std=gnu11 $(OPT) -ffp-contract=off -g -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes -Wno-format-truncation -Wno-missing-field-initializers \
           -pthread -Iinclude -Isrc $(SAN)
ifeq ($(STATIC_DEPS),1)
# libmicrohttpd.a needs GnuTLS, which stays shared (every Debian/Ubuntu system has libgnutls30: apt uses it)
LDLIBS  += -Wl,-Bstatic -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -Wl,-Bdynamic -lgnutls -lm -pthread
else
LDLIBS  += -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread
endif
TESTLIBS = -lcmocka

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
# -fmad=false: as for the C code (-ffp-contract=off above), the only FMAs are the written ones (fmaf). nvcc
# contracts a * b + c * d into fma(a, b, c * d) or fma(c, d, a * b) depending on how the code was unrolled, so two
# layouts of one expression gave different bits (run 42, docs/GPU_RUNS.md), and the CPU shims (tools/gpu/shim,
# g++ without FMA) could not see it.
NVFLAGS   ?= -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo -fmad=false
CU_SRC    := $(sort $(wildcard src/backend/cuda/*.cu))
ifeq ($(CUDA),1)
CFLAGS  += -DDSV4_CUDA -I$(CUDA_HOME)/include
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/%.o)
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
GPU_TEST_SRC := $(sort $(wildcard tests/gpu/test_*.c))
GPU_TEST_BIN := $(GPU_TEST_SRC:tests/gpu/%.c=$(BUILD)/gputests/%)
else
CU_OBJ  :=
GPU_TEST_BIN :=
endif

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/cli/*' -not -path 'src/backend/cpu/isa/*' | sort)
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TEST_HELP:= $(sort $(wildcard tests/unit/helpers/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)

# The CPU kernels of src/backend/cpu/isa/ are compiled once per instruction set, into $(BUILD)/isa-NAME/, with
# -DDSV4_ISA=NAME (their symbols get the suffix _NAME) and the flags of that set whatever -march says; a process
# picks one set at run time (src/backend/cpu/isa.h). With -ffp-contract=off (CFLAGS) the only FMAs are the written
# ones, so the scalar copy (no FMA unit assumed) and the vector copies compute the same expressions.
ISA_SRC  := $(sort $(wildcard src/backend/cpu/isa/*.c))
ifneq ($(filter x86_64%,$(shell $(CC) -dumpmachine)),)
ISAS     := scalar avx2 avx512 avx512bf16
ISA_FLAGS_scalar := -mno-avx
ISA_FLAGS_avx2   := -mavx2 -mfma -mf16c -mno-avx512f
ISA_FLAGS_avx512 := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512dq -mavx512vl
ISA_FLAGS_avx512bf16 := $(ISA_FLAGS_avx512) -mavx512bf16
else
ISAS     := scalar
endif
ISA_OBJ  := $(foreach i,$(ISAS),$(ISA_SRC:%.c=$(BUILD)/isa-$(i)/%.o))
ISA_PIC_OBJ := $(foreach i,$(ISAS),$(ISA_SRC:%.c=$(BUILD)/pic/isa-$(i)/%.o))
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
HELP_OBJ := $(TEST_HELP:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)

# Fuzz targets (tests/fuzz/README.md). Replay programs ($(BUILD)/fuzz/) feed files to a target and run in
# `make test`; libFuzzer programs ($(BUILD)/fuzzers/) are built in build-fuzz by `make fuzz`.
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_LIB := $(sort $(wildcard tests/fuzz/lib/*.c))
FUZZ_LIB_OBJ := $(FUZZ_LIB:%.c=$(BUILD)/%.o)
REPLAY_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)
FUZZER_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzzers/%)
FUZZ_NAMES := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=%)
FUZZ_SECONDS ?= 60
.SECONDARY: $(FUZZ_SRC:%.c=$(BUILD)/%.o) $(BUILD)/tests/fuzz/replay/main.o $(BUILD)/tests/fuzz/tools/make_corpus.o

.PHONY: all test test-asan test-gpu clean fuzz fuzzers fuzz-replay fuzz-corpus fuzz-all fuzz-merge FORCE
all: $(BUILD)/dsv4 $(TEST_BIN) $(GPU_TEST_BIN) $(REPLAY_BIN)

# the AMX kernels are compiled for AVX-512/AMX whatever -march says: they run only where the CPU has them
# (chosen at run time by src/backend/cpu/cpufeat.c)
%/src/backend/cpu/amx.o: CFLAGS += -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512bf16 -mamx-tile -mamx-bf16

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

define isa_rules
$(BUILD)/isa-$(1)/%.o: %.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -fvisibility=hidden $$(ISA_FLAGS_$(1)) -DDSV4_ISA=$(1) -MMD -MP -c $$< -o $$@
$(BUILD)/pic/isa-$(1)/%.o: %.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) -fPIC -fvisibility=hidden $$(ISA_FLAGS_$(1)) -DDSV4_ISA=$(1) -MMD -MP -c $$< -o $$@
endef
$(foreach i,$(ISAS),$(eval $(call isa_rules,$(i))))

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -Iinclude -Isrc -MMD -MP -c $< -o $@

# the chat page is embedded with .incbin (src/server/chat_page.c): rebuild it when the HTML changes
$(BUILD)/src/server/chat_page.o: src/server/chat_page.html

$(BUILD)/libdsv4.a: $(LIB_OBJ) $(ISA_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/dsv4: $(CLI_OBJ) $(BUILD)/libdsv4.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(HELP_OBJ) $(BUILD)/libdsv4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(TESTLIBS) $(LDLIBS)

$(BUILD)/tests/gpu/%.o: CFLAGS += -Itests/unit
$(BUILD)/gputests/%: $(BUILD)/tests/gpu/%.o $(HELP_OBJ) $(BUILD)/libdsv4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(TESTLIBS) $(LDLIBS)

$(BUILD)/fuzz/%: $(BUILD)/tests/fuzz/%.o $(FUZZ_LIB_OBJ) $(BUILD)/tests/fuzz/replay/main.o $(BUILD)/libdsv4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/fuzzers/%: $(BUILD)/tests/fuzz/%.o $(FUZZ_LIB_OBJ) $(BUILD)/libdsv4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)

# Every target in one libFuzzer program (tests/fuzz/multi/main.c picks one by DSV4_FUZZ_TARGET or its name), for
# carrying to another machine (tools/gpu/fuzz_stage.sh): each target compiled again with its entry points renamed,
# and targets.h listing them, rewritten only when the list changes.
$(BUILD)/fuzz-multi/targets.h: FORCE
	@mkdir -p $(dir $@)
	@printf 'FUZZ_TARGET(%s)\n' $(FUZZ_NAMES) >$@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@

$(BUILD)/fuzz-multi/main.o: tests/fuzz/multi/main.c $(BUILD)/fuzz-multi/targets.h
	$(CC) $(CFLAGS) -I$(BUILD)/fuzz-multi -MMD -MP -c $< -o $@

$(BUILD)/fuzz-multi/fuzz_%.o: tests/fuzz/fuzz_%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DLLVMFuzzerTestOneInput=fuzz_target_$*_run -DLLVMFuzzerInitialize=fuzz_target_$*_init -MMD -MP -c $< -o $@

# --as-needed: the targets do not reach libmicrohttpd, so its TLS library (GnuTLS) need not travel.
$(BUILD)/fuzzers/fuzz_all: $(BUILD)/fuzz-multi/main.o $(FUZZ_NAMES:%=$(BUILD)/fuzz-multi/fuzz_%.o) $(FUZZ_LIB_OBJ) $(BUILD)/libdsv4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer -Wl,--as-needed -o $@ $^ $(LDLIBS)

# The seed-corpus generator (tests/fuzz/tools/make_corpus.c): states and checkpoint files of the fuzz fixture.
$(BUILD)/fuzz-tools/make_corpus: $(BUILD)/tests/fuzz/tools/make_corpus.o $(FUZZ_LIB_OBJ) $(BUILD)/libdsv4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# The README's test command. DSV4_BIN / DSV4_TESTS tell the runner where the programs are.
test: all
	BUILD=$(BUILD) tests/run_all.sh

# The same suite under AddressSanitizer + UBSan, in its own build folder. -O2 -march=native as the kernels are
# written for: at -O1 without -march the CPU kernels took their scalar fallbacks (every weight byte three checked
# accesses) and the suite ran 4.7x slower (test_mtp 43 s of CPU against 9 s), 45 of CI's minutes.
# Left out under the sanitizers (CI time): scripts that check documentation, versions and the install layout (no
# engine memory to check), the 965-case tokenizer comparison (the tokenizer's memory safety is what the
# encode / decode / tokenizer_load fuzz targets check, under ASan, in `make fuzz`) and the ajv validation of
# constrained output and of forced tool calls (the constraint engine runs under ASan in test_constraint,
# test_constraint_gen, test_tool_grammar, constrained.sh and the json_schema / grammar / server_request fuzz
# targets; tool_choice.sh's 1000-token tool prompts would take minutes under ASan; response_format_thinking.sh's
# reasoning grammar runs under ASan in test_reply_grammar and test_tool_grammar), and the chat page in chromium
# (the server's memory is serve.sh's under ASan; the page's JavaScript is the browser's), and bits_across_builds.sh
# (a second, unsanitized build of dsv4 compared with the first: no memory of this build to check). test_sched_spec runs
# under ASan again since the -O2 -march=native build (its quick mode: 16 tokens per stream, half the requests).
ASAN_SKIP = tests/cli/bits_across_builds.sh tests/node/test_tokenizer.sh tests/node/test_constraint.sh tests/node/tool_choice.sh tests/node/response_format_thinking.sh tests/node/chat_page.sh tests/cli/install.sh tests/cli/help_man.sh tests/cli/version.sh tests/cli/service_unit.sh
test-asan:
	$(MAKE) BUILD=build-asan OPT="-O2 -march=native" SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all
	BUILD=build-asan DSV4_QUICK=1 SKIP="$(ASAN_SKIP)" tests/run_all.sh

# The GPU suite (needs a GPU): the CUDA build, then every GPU test program and tests/gpu/*.sh.
test-gpu:
	$(MAKE) CUDA=1 all
	BUILD=build-cuda tests/run_gpu.sh

# Fuzzing with libFuzzer (clang): every target for FUZZ_SECONDS seconds, one after another; fails on any crash,
# leak, sanitizer report or broken invariant (tests/fuzz/run.sh). FUZZ_TARGETS=name,... picks some.
FUZZ_SAN = -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer \
           -Wno-unknown-warning-option
fuzzers: $(FUZZER_BIN)
fuzz:
	$(MAKE) CC=clang CUDA=0 BUILD=build-fuzz OPT="-O1 -march=native" SAN="$(FUZZ_SAN)" fuzzers
	FUZZ_SKIP=$(FUZZ_SKIP) tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# fuzz_all for the lent GPU machine: a baseline x86-64-v3 build, jansson / PCRE2 / xxhash linked statically.
fuzz-all:
	$(MAKE) CC=clang CUDA=0 BUILD=build-fuzz-all OPT="-O1 -march=x86-64-v3" SAN="$(FUZZ_SAN)" STATIC_DEPS=1 \
	    build-fuzz-all/fuzzers/fuzz_all

# Merge what a run of tools/gpu/fuzz_bg.sh brought back (FUZZ_RESULTS=fuzz.tgz) into tests/fuzz/corpus/, keeping only
# inputs that add coverage and staying under the size limits (tools/fuzz_merge.sh); appends the run to HOURS.md.
fuzz-merge:
	$(MAKE) CC=clang CUDA=0 BUILD=build-fuzz OPT="-O1 -march=native" SAN="$(FUZZ_SAN)" fuzzers
	tools/fuzz_merge.sh build-fuzz $(FUZZ_RESULTS)

# Replay every corpus and regression input through every target (also part of `make test`).
fuzz-replay: all
	BUILD=$(BUILD) bash tests/cli/fuzz_replay.sh

# Regenerate the fixture-made seeds under tests/fuzz/corpus/ (after changing lib/tiny_fixture.c).
fuzz-corpus: $(BUILD)/fuzz-tools/make_corpus
	$(BUILD)/fuzz-tools/make_corpus tests/fuzz/corpus

clean:
	rm -rf build build-asan build-cuda build-fuzz build-fuzz-all

include mk/install.mk

-include $(LIB_OBJ:.o=.d) $(ISA_OBJ:.o=.d) $(ISA_PIC_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(HELP_OBJ:.o=.d) $(CU_OBJ:.o=.d) $(FUZZ_LIB_OBJ:.o=.d) $(FUZZ_SRC:%.c=$(BUILD)/%.d) $(FUZZ_NAMES:%=$(BUILD)/fuzz-multi/fuzz_%.d) $(BUILD)/fuzz-multi/main.d $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/tests/unit/%.d)
