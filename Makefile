# ditto — plain Makefile.  make | make test | make SANITIZE=address,undefined | make CUDA=1
CC ?= cc
OPT ?= -O2 -g
SANITIZE ?=
BUILD ?= build$(if $(SANITIZE),-san)

# x86-64 baseline with FMA/F16C (Haswell / Zen and later); AVX2 and AVX-512
# kernels live in their own files and are chosen at run time.
ARCH_FLAGS ?= -mfma -mf16c
CFLAGS := -std=c11 -D_GNU_SOURCE $(OPT) -Wall -Wextra -Werror -ffp-contract=off -fno-math-errno \
          -fno-fast-math $(ARCH_FLAGS) -pthread -iquote src $(CFLAGS_EXTRA)
LDFLAGS := -pthread $(LDFLAGS_EXTRA)
LIBS := -lpcre2-8 -lutf8proc -lcjson -lmicrohttpd -lm
ifneq ($(SANITIZE),)
CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZE)
endif

AVX2_FLAGS := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni

LIB_SRC := $(filter-out src/main.c,$(wildcard src/*.c src/cpu/*.c))
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
HDRS := $(wildcard src/*.h src/cpu/*.h tests/*.h)

all: ditto

ditto: $(BUILD)/ditto
	cp $< $@

$(BUILD)/ditto: $(BUILD)/src/main.o $(BUILD)/libditto.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(BUILD)/libditto.a: $(LIB_OBJ)
	rm -f $@
	ar rcs $@ $^

$(BUILD)/src/cpu/%_avx2.o: src/cpu/%_avx2.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -c -o $@ $<

$(BUILD)/src/cpu/%_avx2vnni.o: src/cpu/%_avx2vnni.c src/cpu/%_avx2.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) -mavxvnni -c -o $@ $<

$(BUILD)/src/cpu/%_avx512.o: src/cpu/%_avx512.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(AVX512_FLAGS) -c -o $@ $<

$(BUILD)/%.o: %.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/tests/%: tests/%.c $(BUILD)/libditto.a $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -iquote tests $(LDFLAGS) -o $@ $< $(BUILD)/libditto.a $(LIBS)

tests: $(TEST_BIN) $(BUILD)/ditto

# Runs every tests/test_* binary (TESTS=name filters); ends with "N passed, N failed".
test: tests
	@BUILD=$(BUILD) sh tests/run.sh $(TESTS)

clean:
	rm -rf build build-san ditto

.PHONY: all test tests clean ditto
