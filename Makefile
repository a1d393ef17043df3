# dsv4 build. Every .c under src/ (except src/cli) goes into libdsv4.a; src/cli/*.c is the dsv4 binary;
# every tests/unit/test_*.c is its own test program linked against the library.
# Adding a file needs no edit here.

CC      ?= cc
BUILD   ?= build
OPT     ?= -O3 -march=native
SAN     ?=
CFLAGS  += -std=gnu11 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -Wshadow -Wstrict-prototypes -Wno-format-truncation -Wno-missing-field-initializers \
           -pthread -Iinclude -Isrc $(SAN)
LDLIBS  += -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread
TESTLIBS = -lcmocka

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/cli/*' | sort)
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
TEST_HELP:= $(sort $(wildcard tests/unit/helpers/*.c))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
HELP_OBJ := $(TEST_HELP:%.c=$(BUILD)/%.o)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)

.PHONY: all test test-asan clean
all: $(BUILD)/dsv4 $(TEST_BIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# the chat page is embedded with .incbin (src/server/chat_page.c): rebuild it when the HTML changes
$(BUILD)/src/server/chat_page.o: src/server/chat_page.html

$(BUILD)/libdsv4.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/dsv4: $(CLI_OBJ) $(BUILD)/libdsv4.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(HELP_OBJ) $(BUILD)/libdsv4.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(TESTLIBS) $(LDLIBS)

# The README's test command. DSV4_BIN / DSV4_TESTS tell the runner where the programs are.
test: all
	BUILD=$(BUILD) tests/run_all.sh

# The same suite under AddressSanitizer + UBSan, in its own build folder.
test-asan:
	$(MAKE) BUILD=build-asan OPT="-O1" SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" all
	BUILD=build-asan DSV4_QUICK=1 tests/run_all.sh

clean:
	rm -rf build build-asan

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(HELP_OBJ:.o=.d) $(TEST_BIN:$(BUILD)/tests/%=$(BUILD)/tests/unit/%.d)
