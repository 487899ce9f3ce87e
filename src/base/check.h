// MOE_CHECK: invariants that only a bug can break. Bad user input must never reach one.
#pragma once

#include <cstdio>
#include <cstdlib>

#define MOE_CHECK(cond, ...)                                                     \
  do {                                                                           \
    if (!(cond)) [[unlikely]] {                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                         \
      std::fputc('\n', stderr);                                                  \
      std::abort();                                                              \
    }                                                                            \
  } while (0)
