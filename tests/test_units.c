/* test_units.c — sizes, rates and FLOP/s with units; number formatting. */
#include "check.h"
#include "mtc.h"

static double parse(const char *s, Quantity q) {
  double v = -1;
  char err[300];
  if (!units_parse(s, q, &v, err, sizeof err)) return -1;
  return v;
}

static bool refused(const char *s, Quantity q, const char *needle) {
  double v;
  char err[300] = "";
  bool ok = units_parse(s, q, &v, err, sizeof err);
  if (!ok && needle && !strstr(err, needle)) fprintf(stderr, "  message: %s\n", err);
  return !ok && (!needle || strstr(err, needle));
}

int main(void) {
  /* sizes: decimal and binary prefixes; plain numbers are bytes */
  CHECK(parse("96 GB", Q_SIZE) == 96e9);
  CHECK(parse("120GiB", Q_SIZE) == 120.0 * 1073741824.0);
  CHECK(parse("1.5 KiB", Q_SIZE) == 1536);
  CHECK(parse("2 kB", Q_SIZE) == 2000);
  CHECK(parse("3 MB", Q_SIZE) == 3e6);
  CHECK(parse("4 MiB", Q_SIZE) == 4.0 * 1048576);
  CHECK(parse("1 TB", Q_SIZE) == 1e12);
  CHECK(parse("1 TiB", Q_SIZE) == 1099511627776.0);
  CHECK(refused("80", Q_SIZE, "no unit; expected a size with a unit; did you mean '80 GB'?"));
  CHECK(refused("85899345920", Q_SIZE, "did you mean '85899345920 B'?"));
  CHECK(parse("512 B", Q_SIZE) == 512);
  CHECK(parse("  7 GB  ", Q_SIZE) == 7e9);
  /* counts: the same prefixes, an optional 'tokens', whole numbers only */
  CHECK(parse("25M", Q_COUNT) == 25e6);
  CHECK(parse("24Mi", Q_COUNT) == 25165824);
  CHECK(parse("24 Mi tokens", Q_COUNT) == 25165824);
  CHECK(parse("1.5k", Q_COUNT) == 1500);
  CHECK(parse("4096", Q_COUNT) == 4096);
  CHECK(parse("1.5", Q_COUNT) < 0);
  CHECK(parse("25 MB", Q_COUNT) < 0);
  /* rates */
  CHECK(parse("25 GB/s", Q_RATE) == 25e9);
  CHECK(parse("4 TB/s", Q_RATE) == 4e12);
  CHECK(parse("450GB/s", Q_RATE) == 450e9);
  CHECK(parse("1 GiB/s", Q_RATE) == 1073741824.0);
  CHECK(refused("450", Q_RATE, "did you mean '450 GB/s'?"));
  CHECK(parse("100 B/s", Q_RATE) == 100);
  /* compute */
  CHECK(parse("989 TFLOP/s", Q_FLOPS) == 989e12);
  CHECK(parse("50 GFLOP/s", Q_FLOPS) == 50e9);
  CHECK(parse("1.979 PFLOP/s", Q_FLOPS) == 1.979e15);
  CHECK(refused("2e12", Q_FLOPS, "did you mean '2e12 FLOP/s'?"));
  CHECK(refused("989", Q_FLOPS, "did you mean '989 TFLOP/s'?"));
  CHECK(parse("2e12 FLOP/s", Q_FLOPS) == 2e12);
  CHECK(refused("0", Q_SIZE, "greater than zero")); /* 0 is out of range, not a missing unit */
  /* refusals, each with what was expected */
  CHECK(refused("96 Gb", Q_SIZE, "bits are not accepted"));
  CHECK(refused("96 KB", Q_SIZE, "write kB for 1000 or KiB for 1024"));
  CHECK(refused("96 GB/s", Q_SIZE, "this key is a size"));
  CHECK(refused("25 GB", Q_RATE, "add /s"));
  CHECK(refused("989 TiFLOP/s", Q_FLOPS, "unknown unit"));
  CHECK(refused("-1 GB", Q_SIZE, "negative"));
  CHECK(refused("0 GB", Q_SIZE, "greater than zero"));
  CHECK(refused("GB", Q_SIZE, "not a number"));
  CHECK(refused("", Q_SIZE, "not a number"));
  CHECK(refused("1e400 B", Q_SIZE, "not a finite number"));
  CHECK(refused("8 EB", Q_SIZE, "unknown unit"));
  CHECK(refused("5 PiB", Q_SIZE, NULL) == false); /* 5 PiB < 2^62 */
  CHECK(refused("4096 PiB", Q_SIZE, "out of range"));
  CHECK(refused("12 parsecs", Q_SIZE, "expected a size"));

  /* formatting */
  char b[64];
  units_fmt_bytes_bin(b, sizeof b, 59592671232.0);
  CHECK_STR(b, "55.5 GiB");
  units_fmt_bytes_dec(b, sizeof b, 96e9);
  CHECK_STR(b, "96.0 GB");
  units_fmt_bytes_dec(b, sizeof b, 512);
  CHECK_STR(b, "512 B");
  units_fmt_count(b, sizeof b, 951799117824.0);
  CHECK_STR(b, "951.80 B");
  units_fmt_int(b, sizeof b, 951799117824LL);
  CHECK_STR(b, "951,799,117,824");
  units_fmt_int(b, sizeof b, -1234);
  CHECK_STR(b, "-1,234");
  units_fmt_int(b, sizeof b, 999);
  CHECK_STR(b, "999");
  return CHECK_DONE("test_units");
}
