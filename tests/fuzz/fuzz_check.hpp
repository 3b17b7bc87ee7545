#pragma once
// What the fuzz targets share: a check that stops the fuzzer with a message
// when a documented property of the code under test does not hold (libFuzzer
// then saves the input as a crash), independent of NDEBUG.

#include <cstdio>
#include <cstdlib>

/// Aborts with `what` and the source line when `cond` is false.
#define FUZZ_CHECK(cond, what)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, what); \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)
