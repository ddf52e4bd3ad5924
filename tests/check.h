/* check.h — the assertions of mtc's C tests. Each failure prints the expression, the values
 * and the line; main returns the failure count (0 = pass). */
#ifndef MTC_CHECK_H
#define MTC_CHECK_H
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#ifdef CHECK_SHARED /* a test of several files: one of them defines int check_failures, check_count; */
extern int check_failures, check_count;
#else
static int check_failures, check_count;
#endif

#define CHECK(expr)                                                                     \
  do {                                                                                  \
    check_count++;                                                                      \
    if (!(expr)) {                                                                      \
      check_failures++;                                                                 \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #expr);          \
    }                                                                                   \
  } while (0)

/* Integers: prints both values. */
#define CHECK_EQ(a, b)                                                                  \
  do {                                                                                  \
    long long va_ = (long long)(a), vb_ = (long long)(b);                               \
    check_count++;                                                                      \
    if (va_ != vb_) {                                                                   \
      check_failures++;                                                                 \
      fprintf(stderr, "%s:%d: %s => %lld, expected %s => %lld\n", __FILE__, __LINE__,   \
              #a, va_, #b, vb_);                                                        \
    }                                                                                   \
  } while (0)

/* Relative closeness: |a - b| <= rel * |b|. */
#define CHECK_NEAR(a, b, rel)                                                           \
  do {                                                                                  \
    double va_ = (double)(a), vb_ = (double)(b);                                        \
    check_count++;                                                                      \
    if (!(fabs(va_ - vb_) <= (rel) * fabs(vb_))) {                                      \
      check_failures++;                                                                 \
      fprintf(stderr, "%s:%d: %s => %.6g, expected %.6g within %g%%\n", __FILE__,       \
              __LINE__, #a, va_, vb_, 100.0 * (rel));                                   \
    }                                                                                   \
  } while (0)

#define CHECK_STR(a, b)                                                                 \
  do {                                                                                  \
    const char *va_ = (a), *vb_ = (b);                                                  \
    check_count++;                                                                      \
    if (!va_ || strcmp(va_, vb_) != 0) {                                                \
      check_failures++;                                                                 \
      fprintf(stderr, "%s:%d: %s => \"%s\", expected \"%s\"\n", __FILE__, __LINE__, #a, \
              va_ ? va_ : "(null)", vb_);                                               \
    }                                                                                   \
  } while (0)

#define CHECK_DONE(name)                                                                \
  (fprintf(stderr, "%s: %d checks, %d failed\n", name, check_count, check_failures),   \
   check_failures != 0)

#endif
