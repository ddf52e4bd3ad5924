/* train_util.c — initialization and the sharded AdamW step of generated programs. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mtrt_ckpt.h"
#include "mtrt_train.h"

/* splitmix64 (Steele, Lea & Flood 2014): a counter-based generator, so element i of a tensor
 * gets the same value whichever rank computes it. */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A uniform in (0, 1) from 53 bits of a hash. */
static double unit(uint64_t h) { return ((double)(h >> 11) + 0.5) / 9007199254740992.0; }

/* A tensor's key: its name, expert and the seed, hashed once per tensor piece. */
static uint64_t init_key(const char *name, int expert, uint64_t seed) {
  return mix64(seed ^ rt_fnv1a(RT_FNV_SEED, name, strlen(name))) ^ mix64((uint64_t)(int64_t)expert + 0x51ull);
}

/* Element i of the tensor whose key is key: std times a normal from Box-Muller over two uniforms. */
static real init_at(uint64_t key, int64_t i, float std) {
  uint64_t h = mix64(key + 2 * (uint64_t)i), h2 = mix64(key + 2 * (uint64_t)i + 1);
  double z = sqrt(-2.0 * log(unit(h))) * cos(6.283185307179586 * unit(h2));
  return (real)(std * z);
}

real rt_init_value(const char *name, int expert, int64_t i, float std, bool one, uint64_t seed) {
  return one ? 1 : init_at(init_key(name, expert, seed), i, std);
}

/* One thread's part of a piece: dst[i] = element first + i of the tensor keyed key. */
typedef struct {
  real *dst;
  uint64_t key;
  int64_t first, n;
  float std;
} InitPart;

static void *init_part(void *arg) {
  InitPart *p = arg;
  for (int64_t i = 0; i < p->n; i++) p->dst[i] = init_at(p->key, p->first + i, p->std);
  return NULL;
}

/* Fills n elements over up to the host's online cores (at least 1M elements each): the values are
 * counter-based, so the split changes nothing. A thread that cannot start runs inline. */
static void init_fill(real *dst, uint64_t key, int64_t first, int64_t n, float std) {
  enum { MAX_THREADS = 64, MIN_PER_THREAD = 1 << 20 };
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int64_t nt = n / MIN_PER_THREAD;
  if (nt > cpus) nt = cpus;
  if (nt > MAX_THREADS) nt = MAX_THREADS;
  if (nt < 1) nt = 1;
  pthread_t th[MAX_THREADS];
  InitPart part[MAX_THREADS];
  int started[MAX_THREADS] = {0};
  for (int64_t t = 0; t < nt; t++) {
    int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    part[t] = (InitPart){dst + lo, key, first + lo, hi - lo, std};
    if (t > 0) started[t] = pthread_create(&th[t], NULL, init_part, &part[t]) == 0;
  }
  init_part(&part[0]);
  for (int64_t t = 1; t < nt; t++) {
    if (started[t]) pthread_join(th[t], NULL);
    else init_part(&part[t]);
  }
}

/* The name is hashed once per piece, not per element, and the elements are filled by all cores:
 * moe-1b's 1.9G-element shard on one GPU spent about two minutes of its start-up here, serially. */
void rt_init_shard(real *shard, const RtTensor *t, int nt, int g, int64_t lo, int64_t hi,
                   int ep_rank, uint64_t seed) {
  for (int64_t i = 0; i < hi - lo; i++) shard[i] = 0;
  RT_FOR_PIECES(t, nt, g, lo, hi, {
    int e = T->experts ? ep_rank * T->experts + k : -1;
    char name[256];
    if (T->experts) snprintf(name, sizeof name, T->name, e);
    else snprintf(name, sizeof name, "%s", T->name);
    uint64_t key = init_key(name, e, seed);
    if (T->init_one)
      for (int64_t i = 0; i < len; i++) shard[at + i] = 1;
    else init_fill(shard + at, key, first, len, T->init_std);
  })
}

void rt_adamw_shard(real *param, float *m, float *v, const real *grad, const RtTensor *t, int nt,
                    int g, int64_t lo, int64_t hi, float grad_scale, const RtAdamW *h) {
  RtAdamW nodecay = *h;
  nodecay.weight_decay = 0;
  int64_t vat = 0; /* the second moment: the AdamW pieces' values one after another */
  RT_FOR_PIECES(t, nt, g, lo, hi, {
    (void)first;
    if (T->muon) continue;
    rt_adamw_update(param + at, m + at, v + vat, grad + at, (size_t)len, grad_scale,
                    T->decay ? h : &nodecay);
    vat += len;
  })
}

double rt_opt_bytes(const RtTensor *t, int nt, int g, int64_t lo, int64_t hi) {
  double bytes = 0;
  RT_FOR_PIECES(t, nt, g, lo, hi, {
    (void)first;
    (void)at;
    bytes += (double)len * (T->muon ? 22 : 30);
  })
  return bytes;
}

double rt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int64_t rt_peak_rss_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
  fclose(f);
  return kb < 0 ? -1 : (int64_t)kb * 1024;
}

void rt_prefault(void *p, size_t bytes) {
  volatile char *c = p; /* volatile: a compiler may drop a memset of calloc'ed memory */
  for (size_t i = 0; i < bytes; i += 4096) c[i] = 0;
  if (bytes) c[bytes - 1] = 0;
}

void rt_moe_note(RtCtx *c) {
  const RtA2A *a = &c->a2a;
  double load = a->mean ? (double)a->busiest / (double)a->mean : 0;
  if (load > c->moe_load) c->moe_load = load;
  c->moe_extra_rounds += a->rounds - 1;
}
