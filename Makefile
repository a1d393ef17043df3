# dsv4 build. Every .c under src/ (except src/cli) goes into libdsv4.a; src/cli/*.c is the dsv4 binary;
# every tests/unit/test_*.c is its own test program linked against the library.
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
CFLAGS  += -std=gnu11 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes -Wno-format-truncation -Wno-missing-field-initializers \
           -pthread -Iinclude -Isrc $(SAN)
ifeq ($(STATIC_DEPS),1)
LDLIBS  += -Wl,-Bstatic -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -Wl,-Bdynamic -lm -pthread
else
LDLIBS  += -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread
endif
TESTLIBS = -lcmocka

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
NVFLAGS   ?= -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -lineinfo
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

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/cli/*' | sort)
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TEST_HELP:= $(sort $(wildcard tests/unit/helpers/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
HELP_OBJ := $(TEST_HELP:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)

.PHONY: all test test-asan test-gpu clean
all: $(BUILD)/dsv4 $(TEST_BIN) $(GPU_TEST_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -Iinclude -Isrc -MMD -MP -c $< -o $@

# the chat page is embedded with .incbin (src/server/chat_page.c): rebuild it when the HTML changes
$(BUILD)/src/server/chat_page.o: src/server/chat_page.html

$(BUILD)/libdsv4.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/dsv4: $(CLI_OBJ) $(BUILD)/libdsv4.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(HELP_OBJ) $(BUILD)/libdsv4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(TESTLIBS) $(LDLIBS)

$(BUILD)/gputests/%: $(BUILD)/tests/gpu/%.o $(HELP_OBJ) $(BUILD)/libdsv4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(TESTLIBS) $(LDLIBS)

# The README's test command. DSV4_BIN / DSV4_TESTS tell the runner where the programs are.
test: all
	BUILD=$(BUILD) tests/run_all.sh

# The same suite under AddressSanitizer + UBSan, in its own build folder.
test-asan:
	$(MAKE) BUILD=build-asan OPT="-O1" SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all
	BUILD=build-asan DSV4_QUICK=1 tests/run_all.sh

# The GPU suite (needs a GPU): the CUDA build, then every GPU test program and tests/gpu/*.sh.
test-gpu:
	$(MAKE) CUDA=1 all
	BUILD=build-cuda tests/run_gpu.sh

clean:
	rm -rf build build-asan build-cuda

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(HELP_OBJ:.o=.d) $(CU_OBJ:.o=.d) $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/tests/unit/%.d)
