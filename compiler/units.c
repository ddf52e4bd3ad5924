/* units.c — quantities with units: sizes (bytes), rates (bytes/s), compute (FLOP/s), counts. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mtc.h"

/* A prefix and its multiplier: decimal (SI) and binary (IEC 80000-13). */
typedef struct {
  const char *name;
  double mult;
} Prefix;

static const Prefix prefixes[] = {
    {"", 1},       {"k", 1e3},   {"M", 1e6},   {"G", 1e9},   {"T", 1e12},
    {"P", 1e15},   {"Ki", 0x1p10}, {"Mi", 0x1p20}, {"Gi", 0x1p30}, {"Ti", 0x1p40},
    {"Pi", 0x1p50},
};

static const char *expected(Quantity q) {
  switch (q) {
  case Q_SIZE: return "a size such as '96 GB' or '120 GiB' (B, kB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB)";
  case Q_RATE: return "a rate such as '25 GB/s' or '4 TB/s' (B/s with k, M, G, T, P or Ki, Mi, Gi, Ti, Pi)";
  case Q_FLOPS: return "a compute rate such as '989 TFLOP/s' (FLOP/s with k, M, G, T, P)";
  case Q_COUNT: return "a whole count such as 25165824, '25M' or '24Mi' (k, M, G, T, P or Ki, Mi, Gi, Ti, Pi; 'tokens' may follow)";
  }
  return "";
}

/* The unit a bare number of quantity q most likely meant, for "did you mean": numbers below
 * 10^4 are taken as GB, GB/s or TFLOP/s (the scale of a spec's HBM, link and peak figures:
 * 80 GB, 450 GB/s, 989 TFLOP/s); larger ones as the base unit they were parsed in. The text is
 * the number as written (from p to end); the hint is written into buf (n bytes). */
static const char *bare_hint(char *buf, size_t n, const char *p, const char *end, double v, Quantity q) {
  int len = (int)(end - p) < 60 ? (int)(end - p) : 60;
  bool small = v < 1e4;
  const char *unit = q == Q_SIZE ? (small ? "GB" : "B") : q == Q_RATE ? (small ? "GB/s" : "B/s")
                                                                      : (small ? "TFLOP/s" : "FLOP/s");
  snprintf(buf, n, "'%.*s %s'", len, p, unit);
  return buf;
}

/* Splits unit into prefix and base; base must be one of bases[]. */
static bool match_unit(const char *unit, const char *const *bases, double *mult) {
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
    size_t pl = strlen(prefixes[i].name);
    if (strncmp(unit, prefixes[i].name, pl) != 0) continue;
    for (const char *const *b = bases; *b; b++) {
      if (strcmp(unit + pl, *b) == 0) {
        /* FLOP/s take only decimal prefixes; sizes and rates take both */
        if (bases[0][0] == 'F' && strchr(prefixes[i].name, 'i')) continue;
        *mult = prefixes[i].mult;
        return true;
      }
    }
  }
  return false;
}

bool units_parse(const char *text, Quantity q, double *out, char *err, size_t errlen) {
  static const char *const size_bases[] = {"B", NULL};
  static const char *const rate_bases[] = {"B/s", "Bps", NULL};
  static const char *const flop_bases[] = {"FLOP/s", "FLOPS", "flop/s", NULL};
  static const char *const count_bases[] = {"", " tokens", "tokens", NULL};
  const char *p = text;
  while (*p == ' ') p++;
  if (*p == '-') {
    snprintf(err, errlen, "'%s' is negative; expected %s", text, expected(q));
    return false;
  }
  if (!isdigit((unsigned char)*p) && *p != '.') {
    snprintf(err, errlen, "'%s' is not a number with a unit; expected %s", text, expected(q));
    return false;
  }
  char *end;
  double v = strtod(p, &end);
  for (const char *c = p; c < end; c++)
    if (!strchr("0123456789.eE+-", *c)) { /* hex, inf, nan */
      snprintf(err, errlen, "'%s' is not a decimal number; expected %s", text, expected(q));
      return false;
    }
  if (end == p || !isfinite(v)) {
    snprintf(err, errlen, "'%s' is not a finite number; expected %s", text, expected(q));
    return false;
  }
  while (*end == ' ') end++;
  char unit[32];
  size_t ul = strlen(end);
  while (ul > 0 && end[ul - 1] == ' ') ul--;
  if (ul >= sizeof unit) {
    snprintf(err, errlen, "'%s' has an unknown unit; expected %s", text, expected(q));
    return false;
  }
  memcpy(unit, end, ul);
  unit[ul] = '\0';
  double mult = 1;
  if (ul == 0 && q != Q_COUNT && v > 0) { /* a bare number: bytes or FLOP/s only by accident */
    char hint[96];
    snprintf(err, errlen, "'%s' has no unit; expected %s with a unit; did you mean %s?", text,
             q == Q_SIZE ? "a size" : q == Q_RATE ? "a rate" : "a compute rate",
             bare_hint(hint, sizeof hint, p, end, v, q));
    return false;
  }
  if (ul > 0) {
    const char *const *bases = q == Q_SIZE ? size_bases : q == Q_RATE ? rate_bases : q == Q_COUNT ? count_bases : flop_bases;
    if (!match_unit(unit, bases, &mult)) {
      const char *hint = "";
      if (unit[0] == 'K' && unit[1] != 'i')
        hint = " (write kB for 1000 or KiB for 1024)";
      else if (strchr(unit, 'b') && !strchr(unit, 'B') && q != Q_FLOPS)
        hint = " (bits are not accepted: write bytes, e.g. GB)";
      else if (q == Q_SIZE && strstr(unit, "/s"))
        hint = " (this key is a size, not a rate)";
      else if (q == Q_RATE && !strstr(unit, "/s") && !strstr(unit, "ps"))
        hint = " (this key is a rate: add /s)";
      snprintf(err, errlen, "'%s' has unknown unit '%s'%s; expected %s", text, unit, hint,
               expected(q));
      return false;
    }
  }
  v *= mult;
  if (!(v > 0) || !isfinite(v) || ((q == Q_SIZE || q == Q_COUNT) && v >= 0x1p62)) {
    snprintf(err, errlen, "'%s' is out of range; expected %s, greater than zero%s", text,
             expected(q), q == Q_SIZE ? " and below 4 EiB" : q == Q_COUNT ? " and below 2^62" : "");
    return false;
  }
  if (q == Q_COUNT && v != floor(v)) {
    snprintf(err, errlen, "'%s' is %.17g, not a whole number; expected %s", text, v, expected(q));
    return false;
  }
  if (q == Q_SIZE) v = nearbyint(v); /* whole bytes */
  if (!(v > 0)) {
    snprintf(err, errlen, "'%s' rounds to 0 bytes; expected %s, of at least 1 B", text, expected(q));
    return false;
  }
  *out = v;
  return true;
}

void units_fmt_bytes_bin(char *buf, size_t n, double b) {
  static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (fabs(b) >= 1024 && i < 5) b /= 1024, i++;
  snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

void units_fmt_bytes_dec(char *buf, size_t n, double b) {
  static const char *const u[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int i = 0;
  while (fabs(b) >= 1000 && i < 5) b /= 1000, i++;
  snprintf(buf, n, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

void units_fmt_count(char *buf, size_t n, double c) {
  if (c >= 1e12) snprintf(buf, n, "%.2f T", c / 1e12);
  else if (c >= 1e9) snprintf(buf, n, "%.2f B", c / 1e9);
  else if (c >= 1e6) snprintf(buf, n, "%.2f M", c / 1e6);
  else if (c >= 1e3) snprintf(buf, n, "%.2f k", c / 1e3);
  else snprintf(buf, n, "%.0f", c);
}

void units_fmt_int(char *buf, size_t n, int64_t v) {
  char tmp[32];
  snprintf(tmp, sizeof tmp, "%lld", (long long)(v < 0 ? -v : v));
  size_t len = strlen(tmp), k = 0;
  char out[48];
  if (v < 0) out[k++] = '-';
  for (size_t i = 0; i < len; i++) {
    if (i && (len - i) % 3 == 0) out[k++] = ',';
    out[k++] = tmp[i];
  }
  out[k] = '\0';
  snprintf(buf, n, "%s", out);
}
