// arena_diff STEP_C A.bin B.bin [threshold] — two arena dumps (dump.c) of one program compared
// buffer by buffer, named by step.c's map (`#define NAME offset /* size [plan item]: what */`): per buffer
// the worst relative difference |a - b| / (|b| + 1e-3 · max |b|), the worst absolute one and
// NaN counts (int32 buffers: mismatching entries). Buffers past the threshold (default 1e-3)
// are marked '!'. A is the one under test, B the reference.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fstream>
#include <regex>
#include <string>
#include <vector>

struct Buf {
  std::string name, what;
  long off, n;
};

static std::vector<float> load(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) fprintf(stderr, "arena_diff: cannot open %s\n", path), exit(2);
  fseek(f, 0, SEEK_END);
  long bytes = ftell(f);
  fseek(f, 0, SEEK_SET);
  std::vector<float> v(bytes / 4);
  if (fread(v.data(), 4, v.size(), f) != v.size()) exit(2);
  fclose(f);
  return v;
}

int main(int argc, char **argv) {
  if (argc < 4) return fprintf(stderr, "usage: arena_diff STEP_C A.bin B.bin [threshold]\n"), 2;
  double thr = argc > 4 ? atof(argv[4]) : 1e-3;
  std::ifstream in(argv[1]);
  std::regex re(R"(^#define (\w+) +(\d+) /\* +(\d+)(?: \[\S*\])?: (.*) \*/)");
  std::vector<Buf> bufs;
  long arena_elems = -1, act_elems = -1; // the dump: the arena, the activations, the state (dump.c)
  std::string h = argv[1];
  std::ifstream hin(h.substr(0, h.find_last_of('/') + 1) + "step.h");
  for (std::string line; std::getline(hin, line);) {
    if (line.rfind("#define ARENA_ELEMS ", 0) == 0) arena_elems = std::stol(line.substr(20));
    if (line.rfind("#define ACT_ELEMS ", 0) == 0) act_elems = std::stol(line.substr(18));
  }
  if (arena_elems < 0 || act_elems < 0)
    return fprintf(stderr, "arena_diff: no ARENA_ELEMS or ACT_ELEMS in the step.h beside %s\n", argv[1]), 2;
  // of the map being read: step.c's state map and the HBM span's activation map; the span's real
  // and int32 buffers (-1) are not compared: the dump holds the span as activations converted
  // to real (dump.c), which a real value's bytes are not
  long base = 0;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (line.find("---- the state arena map") != std::string::npos) base = arena_elems + act_elems;
    else if (line.find("---- the HBM span's real and int32 buffers") != std::string::npos) base = -1;
    else if (line.find("---- the HBM span's activation buffers") != std::string::npos) base = arena_elems;
    else if (base >= 0 && std::regex_search(line, m, re) && m[4].str().find("fp32") == std::string::npos)
      bufs.push_back({m[1], m[4], std::stol(m[2]) + base, std::stol(m[3])});
  }
  std::vector<float> a = load(argv[2]), b = load(argv[3]);
  if (a.size() != b.size()) return fprintf(stderr, "arena_diff: sizes differ\n"), 2;
  int bad = 0;
  for (const Buf &u : bufs) {
    if (u.off + u.n > (long)a.size()) continue;
    const float *x = &a[u.off], *y = &b[u.off];
    if (u.what.find("int32") != std::string::npos) {
      long diff = 0;
      for (long i = 0; i < u.n; i++) diff += memcmp(&x[i], &y[i], 4) != 0;
      printf("%c %-22s %9ld int32: %ld of %ld differ\n", diff ? '!' : ' ', u.name.c_str(), u.n, diff, u.n);
      bad += diff != 0;
      continue;
    }
    double scale = 0, worst = 0, abs_worst = 0;
    long nan_a = 0, nan_b = 0, at = -1;
    for (long i = 0; i < u.n; i++) scale = fmax(scale, isfinite(y[i]) ? fabs(y[i]) : 0);
    for (long i = 0; i < u.n; i++) {
      nan_a += !isfinite(x[i]), nan_b += !isfinite(y[i]);
      if (!isfinite(x[i]) || !isfinite(y[i])) continue;
      double d = fabs((double)x[i] - y[i]), r = d / (fabs(y[i]) + 1e-3 * scale + 1e-30);
      if (r > worst) worst = r, at = i;
      abs_worst = fmax(abs_worst, d);
    }
    bool flag = worst > thr || nan_a != nan_b;
    bad += flag;
    printf("%c %-22s %9ld rel %.2e abs %.2e max|ref| %.2e", flag ? '!' : ' ', u.name.c_str(), u.n, worst, abs_worst, scale);
    if (at >= 0 && flag) printf(" (worst at %ld: %g vs %g)", at, x[at], y[at]);
    if (nan_a || nan_b) printf(" non-finite %ld vs %ld", nan_a, nan_b);
    printf("  %s\n", u.what.c_str());
  }
  printf("%d buffer(s) differ beyond %.0e\n", bad, thr);
  return bad ? 1 : 0;
}
