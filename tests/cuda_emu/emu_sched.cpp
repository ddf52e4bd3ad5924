// emu_sched.cpp — runs a kernel's grid on the CPU. Blocks go to a pool of worker threads
// ($EMU_THREADS, default 1: deterministic atomics); each worker runs one block at a time, its
// threads as fibers (a small context switch below, x86-64 only) that switch only at barriers:
// __syncthreads (every live thread of the block), __syncwarp and shuffles (the warp's live lanes).
// A thread runs on a pooled stack until it blocks or returns, so a kernel without barriers costs
// one switch per thread. A barrier nobody can complete is a deadlock: reported, then abort.
// A barrier completed after some threads returned (legal on sm_70+ for __syncthreads, undefined
// for a full-mask shuffle) is reported once per kernel. $EMU_SCHED=random resumes the fibers
// waiting at a barrier in random order (and starts threads in random order), so a missing
// barrier shows as a run-to-run difference.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <stdarg.h>
#include <thread>
#include <vector>

#include "emu_device.h"
#include "emu_sched.h"

__thread EmuThreadPub *emu_self;
__thread EmuDim blockIdx, blockDim, gridDim;
int emu_acc_map[32][8];

void emu_fail(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cuda-emu: ERROR: %s (kernel %s, block %u,%u,%u thread %u)\n", msg, emu_current_kernel(),
          blockIdx.x, blockIdx.y, blockIdx.z, emu_self ? emu_self->tid.x : 0);
  fflush(stderr);
  abort();
}

// ---- context switch: save callee-saved registers on the old stack, load the new one ----
extern "C" void emu_switch(void **save_sp, void *new_sp);
asm(R"(
.text
.globl emu_switch
.type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size emu_switch, .-emu_switch
)");

enum { MAX_THREADS = 1024, STACK_BYTES = 256 << 10, GUARD = 4096 };
enum { T_NEW, T_READY, T_BLOCKED, T_DONE };

struct Barrier {
  int expected = 0, arrived = 0, exited = 0;
  struct EmuThread *waiters[MAX_THREADS];
  const char *what = "";
};

struct EmuThread {
  EmuThreadPub pub;
  void *sp = nullptr;
  char *stack = nullptr;
  int state = T_NEW;
  Barrier *waiting = nullptr;
};

struct Worker {
  void *sched_sp = nullptr;
  std::vector<char *> free_stacks;
  EmuThread th[MAX_THREADS];
  EmuThread *ready[MAX_THREADS]; // a ring: threads released by a barrier, in release order
  unsigned head = 0, count = 0;
  unsigned order[MAX_THREADS];   // the order threads start in
  Barrier block_bar, warp_bar[MAX_THREADS / 32];
  uint64_t xch[MAX_THREADS / 32][2][32];   // per warp, double-buffered shuffle slots
  unsigned stamp[MAX_THREADS / 32][2][32]; // the shuffle (count) that wrote each slot, + 1
  const EmuKernel *k = nullptr;
  void **args = nullptr;
  unsigned nthreads = 0, started = 0, live = 0;
  EmuThread *cur = nullptr;
  std::mt19937 rng{12345};
  bool random = false;
};
static thread_local Worker *W;

static char *new_stack(void) {
  if (!W->free_stacks.empty()) {
    char *s = W->free_stacks.back();
    W->free_stacks.pop_back();
    return s;
  }
  char *s = (char *)mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (s == MAP_FAILED) emu_fail("cannot map a fiber stack");
  mprotect(s, GUARD, PROT_NONE); // an overflow faults here
  return s;
}

static void fiber_main(void);

static void start(EmuThread *t) {
  t->stack = new_stack();
  void **top = (void **)(t->stack + STACK_BYTES);
  *--top = nullptr;            // fake return address of fiber_main (alignment: rsp % 16 == 8 at entry)
  *--top = (void *)fiber_main; // emu_switch's ret goes here
  for (int i = 0; i < 6; i++) *--top = nullptr; // rbp rbx r12-r15
  t->sp = top;
  t->state = T_READY;
}

// The next thread to run: a released one first (fifo; random with EMU_SCHED=random), else one
// not started yet; nullptr when none can run.
static EmuThread *pick(void) {
  Worker *w = W;
  if (w->count) {
    unsigned i = w->random ? w->rng() % w->count : 0, at = (w->head + i) % MAX_THREADS;
    EmuThread *t = w->ready[at];
    w->ready[at] = w->ready[w->head];
    w->head = (w->head + 1) % MAX_THREADS, w->count--;
    return t;
  }
  if (w->started < w->nthreads) {
    EmuThread *t = &w->th[w->order[w->started++]];
    start(t);
    return t;
  }
  return nullptr;
}

// Thread t blocks: straight to the next runnable thread (or the scheduler), back when released.
static void block(EmuThread *t) {
  EmuThread *n = pick();
  if (n) {
    W->cur = n, emu_self = &n->pub;
    emu_switch(&t->sp, n->sp);
  } else {
    emu_switch(&t->sp, W->sched_sp);
  }
  W->cur = t, emu_self = &t->pub;
}

static void release(Barrier *b) {
  Worker *w = W;
  for (int i = 0; i < b->arrived; i++) { // the threads blocked at b
    EmuThread *t = b->waiters[i];
    t->state = T_READY, t->waiting = nullptr;
    w->ready[(w->head + w->count++) % MAX_THREADS] = t;
  }
  b->arrived = 0;
}

static void arrive(Barrier *b, const char *what) {
  EmuThread *t = W->cur;
  b->what = what;
  if (b->arrived + 1 == b->expected) { // the last one runs on
    if (b->exited) emu_exited_barrier(what, b->exited);
    release(b);
    return;
  }
  t->state = T_BLOCKED, t->waiting = b;
  b->waiters[b->arrived++] = t;
  block(t);
}

void emu_syncthreads(void) { arrive(&W->block_bar, "__syncthreads"); }
void emu_syncwarp(unsigned mask) {
  if (mask != 0xffffffffu) emu_fail("__syncwarp with a partial mask 0x%x is not emulated", mask);
  arrive(&W->warp_bar[W->cur->pub.warp], "__syncwarp");
}
uint64_t emu_shfl(uint64_t v, int src, unsigned mask) {
  if (mask != 0xffffffffu) emu_fail("shuffle with a partial mask 0x%x is not emulated", mask);
  EmuThreadPub *p = &W->cur->pub;
  unsigned w = p->warp, n = p->shfl++, par = n & 1;
  if (src < 0 || src > 31) emu_fail("shuffle from lane %d", src);
  W->xch[w][par][p->lane] = v, W->stamp[w][par][p->lane] = n + 1;
  arrive(&W->warp_bar[w], "warp shuffle");
  if (W->stamp[w][par][src] != n + 1) emu_fail("shuffle reads lane %d, which did not take part (exited; full mask)", src);
  return W->xch[w][par][src];
}

// A thread leaves: the barriers it would have counted for complete without it.
static void leave(EmuThread *t) {
  t->state = T_DONE;
  W->live--;
  Barrier *bs[2] = {&W->block_bar, &W->warp_bar[t->pub.warp]};
  for (Barrier *b : bs) {
    b->expected--, b->exited++;
    if (b->arrived && b->arrived == b->expected) {
      emu_exited_barrier(b->what, b->exited);
      release(b);
    }
  }
}

static void fiber_main(void) {
  EmuThread *t = W->cur;
  W->k->run(W->args);
  leave(t);
  W->free_stacks.push_back(t->stack); // reused only after the switch below
  emu_switch(&t->sp, W->sched_sp);
  abort(); // never resumed
}

static void deadlock(void) {
  char buf[512];
  int n = 0;
  for (unsigned i = 0; i < W->nthreads && n < 400; i++)
    if (W->th[i].state == T_BLOCKED)
      n += snprintf(buf + n, sizeof buf - n, " %u@%s", i, W->th[i].waiting ? W->th[i].waiting->what : "?");
  emu_fail("deadlock: no thread can run; blocked threads:%s", buf);
}

static void run_block(EmuDim bid) {
  Worker *w = W;
  unsigned n = w->nthreads, warps = (n + 31) / 32;
  blockIdx = bid;
  w->block_bar.expected = (int)n, w->block_bar.arrived = 0, w->block_bar.exited = 0;
  for (unsigned i = 0; i < warps; i++) {
    Barrier &b = w->warp_bar[i];
    b.expected = (int)(n - 32 * i < 32 ? n - 32 * i : 32), b.arrived = 0, b.exited = 0;
    memset(w->stamp[i], 0, sizeof w->stamp[i]);
  }
  for (unsigned i = 0; i < n; i++) {
    EmuThread &t = w->th[i];
    t.state = T_NEW, t.waiting = nullptr;
    t.pub.tid = {i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y)};
    t.pub.lane = i % 32, t.pub.warp = i / 32, t.pub.shfl = 0;
    w->order[i] = i;
  }
  if (w->random) std::shuffle(w->order, w->order + n, w->rng);
  w->started = 0, w->live = n, w->head = 0, w->count = 0;
  for (;;) {
    EmuThread *t = pick();
    if (!t) {
      if (w->live) deadlock();
      break;
    }
    w->cur = t, emu_self = &t->pub;
    emu_switch(&w->sched_sp, t->sp);
    emu_self = nullptr;
  }
}

// ---- the grid: blocks handed out to workers in index order ----
static int workers(void) {
  static int n = -1;
  if (n < 0) {
    const char *e = getenv("EMU_THREADS");
    n = e ? atoi(e) : 1;
    if (n < 1) n = 1;
  }
  return n;
}

static Worker *worker(void) {
  static thread_local Worker *mine;
  if (!mine) {
    mine = new Worker;
    mine->random = getenv("EMU_SCHED") && strcmp(getenv("EMU_SCHED"), "random") == 0;
    if (getenv("EMU_SEED")) mine->rng.seed((unsigned)atoi(getenv("EMU_SEED")));
  }
  return mine;
}

// One launch: every worker takes blocks in index order until none is left.
static struct {
  const EmuKernel *k;
  void **args;
  EmuDim grid, block;
  long total;
  std::atomic<long> next;
} job;

static void work(void) {
  W = worker();
  W->k = job.k, W->args = job.args, W->nthreads = job.block.x * job.block.y * job.block.z;
  blockDim = job.block, gridDim = job.grid;
  EmuDim g = job.grid;
  for (long b; (b = job.next.fetch_add(1)) < job.total;)
    run_block({(unsigned)(b % g.x), (unsigned)(b / g.x % g.y), (unsigned)(b / ((long)g.x * g.y))});
}

// The pool: workers() - 1 threads that wait for a launch; the caller is the last worker.
// (never destroyed: at exit a destructor would wait for the parked pool threads)
static std::mutex &mu = *new std::mutex;
static std::condition_variable &go = *new std::condition_variable, &done = *new std::condition_variable;
static long generation;
static int busy;

static void pool_thread(void) {
  long seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu);
      go.wait(l, [&] { return generation != seen; });
      seen = generation;
    }
    work();
    std::lock_guard<std::mutex> l(mu);
    if (--busy == 0) done.notify_all();
  }
}

void emu_run_grid(const EmuKernel *k, void **args, EmuDim grid, EmuDim block) {
  static int nw;
  if (!nw) { // first launch: the accumulator layout (a fixed permutation, $EMU_ACC_SEED) and the pool
    int perm[256];
    for (int i = 0; i < 256; i++) perm[i] = i;
    std::mt19937 rng(getenv("EMU_ACC_SEED") ? atoi(getenv("EMU_ACC_SEED")) : 1234);
    std::shuffle(perm, perm + 256, rng);
    for (int i = 0; i < 256; i++) emu_acc_map[i / 8][i % 8] = perm[i];
    nw = workers();
    for (int i = 1; i < nw; i++) std::thread(pool_thread).detach();
  }
  job.k = k, job.args = args, job.grid = grid, job.block = block;
  job.total = (long)grid.x * grid.y * grid.z;
  job.next = 0;
  if (nw > 1 && job.total > 1) {
    std::lock_guard<std::mutex> l(mu);
    busy = nw - 1, generation++;
    go.notify_all();
  }
  work();
  if (nw > 1 && job.total > 1) {
    std::unique_lock<std::mutex> l(mu);
    done.wait(l, [] { return busy == 0; });
  }
}
