// fake_cuda.cpp — the subset of the CUDA runtime, cuBLAS and NCCL that runtime/cuda/*.c and the
// generated train.c call, emulated on the CPU with the real headers' signatures, so the cuda
// backend's host code runs end to end without a GPU (a test tool, not production).
//
//   memory   device memory is host memory (mmap), tracked; cudaMalloc fills it with 0xff (NaN)
//            unless EMU_POISON=0. Copies, memsets, GEMM operands, NCCL buffers and kernel pointer
//            arguments are checked against the allocations: a pageable host pointer where the
//            device reads, a copy past an allocation's end, a wrong cudaMemcpyKind. EMU_PROTECT=1
//            keeps device memory PROT_NONE except while an emulated device operation runs, so host
//            code that dereferences a device pointer faults and is reported with a backtrace. An
//            asynchronous copy from or to pageable host memory is an error (EMU_PAGEABLE_OK).
//   streams  EMU_STREAMS=sync (default): every operation runs when it is issued, so stream order
//            is program order. EMU_STREAMS=lazy: every stream is a queue run as late as CUDA's
//            rules allow (a host wait, an event query, a blocking copy, a stream waiting on an
//            event recorded in it), with pageable copies taken at the call as CUDA does, so a
//            missing wait shows as stale data.
//   kernels  cudaLibraryLoadData ignores the CUBIN's code (it must be an ELF holding the names);
//            the kernels are the program's kernels.cu compiled for the CPU (emu_kernels.cpp) and
//            run by emu_sched.cpp; another source the runtime compiles (test_kernels' preludes) is
//            compiled for the CPU on first use into a cached shared object.
//   cuBLAS   cublasGemmEx and cublasGemmGroupedBatchedEx through OpenBLAS sgemm (column-major).
//            CUBLAS_COMPUTE_32F_FAST_16BF rounds A and B to bf16 first (FAST_TF32: to tf32),
//            unless EMU_GEMM_ROUND=0; bf16 storage is converted. The grouped GEMM refuses the
//            compute types in EMU_GROUPED_REFUSE (default "16bf": the documented types are
//            32F and 32F_FAST_TF32 for fp32 storage), so the runtime's fallback runs.
//   NCCL     over MPI: a communicator is an MPI communicator (the unique id carries nothing);
//            ncclCommSplit is MPI_Comm_split; grouped send/recv are Isend/Irecv and a Waitall.
// A problem that would fault or be undefined on a GPU is reported as "cuda-emu: ERROR" and
// aborts (EMU_STRICT=0: reported only); EMU_TRACE=1 prints every call.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#define OMPI_SKIP_MPICXX 1 // the C API only
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>
#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "emu_sched.h"

// ---- reports ----
static int env_int(const char *name, int dflt) {
  const char *e = getenv(name);
  return e && *e ? atoi(e) : dflt;
}
static bool strict() { return env_int("EMU_STRICT", 1) != 0; }
static bool tracing() {
  static int t = env_int("EMU_TRACE", 0);
  return t;
}
static int my_rank() {
  static int r = -1;
  int inited = 0, finalized = 0;
  if (r < 0) {
    MPI_Initialized(&inited), MPI_Finalized(&finalized);
    if (!inited || finalized) return 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
  }
  return r;
}
static void trace(const char *fmt, ...) {
  if (!tracing()) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "cuda-emu[%d]: ", my_rank());
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}
static std::set<std::string> reported;
static int n_errors, n_warnings;
// An error (would fault or be undefined on a GPU): reported once per message; aborts if strict.
static void emu_error(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  n_errors++;
  if (reported.insert(msg).second) fprintf(stderr, "cuda-emu[%d]: ERROR: %s\n", my_rank(), msg);
  if (strict()) {
    fflush(stderr);
    abort();
  }
}
static void emu_warn(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  n_warnings++;
  if (reported.insert(msg).second) fprintf(stderr, "cuda-emu[%d]: WARNING: %s\n", my_rank(), msg);
}

static const char *cur_kernel = "(host)";
const char *emu_current_kernel(void) { return cur_kernel; }
void emu_exited_barrier(const char *what, int exited) {
  emu_warn("kernel %s: a %s completed after %d thread(s) of the block or warp had returned", cur_kernel, what, exited);
}

// ---- memory: every allocation, by start address ----
enum Kind { K_DEVICE, K_PINNED };
struct Alloc {
  size_t bytes;
  Kind kind;
};
static std::map<uintptr_t, Alloc> allocs;
static size_t device_bytes;
// peaks of device (cudaMalloc) and pinned host (cudaMallocHost) bytes, printed at exit with
// EMU_MEM_REPORT=1 ("emu-memory: ..."), to compare with the program's train --memory
// host_syncs: calls that block the host until device work is done (stream, device and event
// synchronizations, event queries, synchronous copies and copies to pageable host memory)
static size_t device_peak, pinned_bytes, pinned_peak;
// EMU_SYNC_SITES=1 also prints, with the report, the host synchronizations by call site (the
// caller's return addresses, as backtrace_symbols writes them: addr2line -f -e train OFFSET)
static long host_syncs;
static std::map<std::string, long> sync_sites;
// EMU_COUNTS=FILE: what each training step issues, one JSON line per step and rank appended to
// FILE (emu_counts_step, called by dump.c at each step's first forward pass). Not counted while
// dump.c poisons or dumps the arena (emu_counting).
struct Counts {
  long launches, blas, cudnn, memsets, copies, pageable_copies, host_syncs, nccl;
  size_t bytes_h2d, bytes_d2h, bytes_d2d, bytes_memset;
};
static Counts counts;
static bool counting = true;
// EMU_COUNTS_BY=1: each line also holds "by", the step's kernel launches, cuBLAS calls and memsets
// by kernel name or call site (count_by), to see where they go.
static std::map<std::string, long> counts_by;
extern "C" {
static void count_by(const char *kind, const char *name); // (defined in an extern "C" block)
}
static void host_sync(const char *what) {
  host_syncs++;
  if (counting) counts.host_syncs++;
  static int sites = env_int("EMU_SYNC_SITES", 0);
  if (!sites) return;
  void *bt[6];
  int n = backtrace(bt, 6);
  char **sym = backtrace_symbols(bt, n);
  std::string key = what;
  for (int i = 2; sym && i < n; i++) key += std::string(" <- ") + sym[i];
  free(sym);
  sync_sites[key]++;
}
static void mem_report(void) {
  fprintf(stderr, "emu-memory: rank %d device_peak %zu pinned_peak %zu host_syncs %ld\n", my_rank(), device_peak,
          pinned_peak, host_syncs);
  for (auto &s : sync_sites) fprintf(stderr, "emu-sync: rank %d %ld %s\n", my_rank(), s.second, s.first.c_str());
}
// Appends the counts since the last call to $EMU_COUNTS as step `step` of `rank`, then starts
// the next step's; without EMU_COUNTS nothing is written. One write(2) of one line with O_APPEND,
// so the ranks' lines do not interleave.
extern "C" void emu_counts_step(int rank, long step) {
  const char *path = getenv("EMU_COUNTS");
  Counts c = counts;
  counts = Counts{};
  std::map<std::string, long> by;
  by.swap(counts_by);
  if (!path || !*path || step < 1) return;
  char head[768];
  snprintf(head, sizeof head,
           "{\"step\":%ld,\"rank\":%d,\"launches\":%ld,\"blas\":%ld,\"cudnn\":%ld,\"memsets\":%ld,"
           "\"copies\":%ld,\"pageable_copies\":%ld,\"host_syncs\":%ld,\"nccl\":%ld,\"bytes_h2d\":%zu,"
           "\"bytes_d2h\":%zu,\"bytes_d2d\":%zu,\"bytes_memset\":%zu",
           step, rank, c.launches, c.blas, c.cudnn, c.memsets, c.copies, c.pageable_copies, c.host_syncs, c.nccl,
           c.bytes_h2d, c.bytes_d2h, c.bytes_d2d, c.bytes_memset);
  std::string line = head;
  if (!by.empty()) {
    line += ",\"by\":{";
    for (auto it = by.begin(); it != by.end(); ++it) {
      std::string k;
      for (char ch : it->first) k += ch == '"' || ch == '\\' ? '_' : ch;
      line += (it == by.begin() ? "\"" : ",\"") + k + "\":" + std::to_string(it->second);
    }
    line += "}";
  }
  line += "}\n";
  ssize_t n = (ssize_t)line.size();
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0 || write(fd, line.data(), (size_t)n) != n || close(fd) != 0) {
    fprintf(stderr, "cuda-emu: ERROR: EMU_COUNTS=%s: cannot append: %s\n", path, strerror(errno));
    abort();
  }
}
extern "C" void emu_counting(int on) { counting = on != 0; }
static const size_t TOTAL = 80ull << 30; // cudaMemGetInfo's total: a fake 80 GiB

// The allocation holding p, or nullptr.
static const Alloc *find(const void *p, uintptr_t *base = nullptr) {
  uintptr_t a = (uintptr_t)p;
  auto it = allocs.upper_bound(a);
  if (it == allocs.begin()) return nullptr;
  --it;
  if (a >= it->first + it->second.bytes) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}
static const char *where_name(const void *p) {
  const Alloc *a = find(p);
  return !p ? "NULL" : !a ? "pageable host" : a->kind == K_DEVICE ? "device" : "pinned host";
}
// [p, p + bytes) must lie in one allocation the device can read (device or pinned host).
// EMU_ARENA_MAP=DIR/step.c: the buffers of the HBM span (step.c's maps of its real and int32
// buffers and of its activation buffers, offsets in units of 2 bytes of the plan's tier:
// `#define NAME offset /* count: what */`, and aliases in another buffer's bytes, `#define NAME
// OTHER /* count: ... */` or `#define NAME (OTHER + k) /* count: ... */`), so that a device range
// must also stay inside one buffer or alias (the allocation of step.h's ACT_ELEMS activations,
// 2 or 4 bytes each: a unit is one act element; a real or int32 value takes 4 bytes): a GEMM,
// copy, memset or collective that runs into the next buffer is reported.
struct Named {
  std::string name;
  long off, n;
  bool real; // n counts 4-byte values (the real and int32 map), else act elements
};
struct ArenaMap {
  std::vector<Named> bufs; // by offset
  long elems;              // step.h's ACT_ELEMS
};
static ArenaMap hbm_span; // the HBM span
static void load_map(void) {
  static bool done;
  if (done) return;
  done = true;
  const char *path = getenv("EMU_ARENA_MAP");
  FILE *f = path ? fopen(path, "r") : nullptr;
  if (!f) return;
  char line[1024], name[128], of[128];
  long off, n;
  int in = -1; // the map being read (0 real and int32, 1 act): step.c's state arena map is no device arena's
  auto offset_of = [](const ArenaMap &m, const char *nm, long *o) { // an alias's buffer (listed before it)
    for (const Named &b : m.bufs)
      if (b.name == nm) return *o = b.off, true;
    return false;
  };
  while (fgets(line, sizeof line, f))
    if (strstr(line, "---- the state arena map")) in = -1;
    else if (strstr(line, "---- the HBM span's real and int32 buffers")) in = 0;
    else if (strstr(line, "---- the HBM span's activation buffers")) in = 1;
    else if (in >= 0 && sscanf(line, "#define %127s %ld /* %ld:", name, &off, &n) == 3)
      hbm_span.bufs.push_back({name, off, n, in == 0});
    else if (in >= 0 && sscanf(line, "#define %127s (%127[A-Za-z0-9_] + %ld) /* %ld:", name, of, &off, &n) == 4) {
      long base;
      if (offset_of(hbm_span, of, &base)) hbm_span.bufs.push_back({name, base + off, n, in == 0});
    } else if (in >= 0 && sscanf(line, "#define %127s %127[A-Za-z0-9_] /* %ld:", name, of, &n) == 3) {
      long base;
      if (offset_of(hbm_span, of, &base)) hbm_span.bufs.push_back({name, base, n, in == 0});
    }
  fclose(f);
  std::sort(hbm_span.bufs.begin(), hbm_span.bufs.end(), [](const Named &a, const Named &b) { return a.off < b.off; });
  std::string h = path; // the span's size: step.h beside step.c
  h = h.substr(0, h.find_last_of('/') + 1) + "step.h";
  if ((f = fopen(h.c_str(), "r"))) {
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "#define ACT_ELEMS %ld", &n) == 1) hbm_span.elems = n;
    fclose(f);
  }
}
static int arena_checks = 1;
extern "C" void emu_arena_checks(int on) { arena_checks = on; } // dump.c's poison spans buffers
// Units of buffer b when a unit (an act element) is es bytes.
static long units(const Named &b, size_t es) { return b.real ? b.n * 4 / (long)es : b.n; }
static const Named *buffer_at(const ArenaMap &m, long e, size_t es) {
  const Named *best = nullptr;
  for (const Named &b : m.bufs)
    if (b.off <= e && e < b.off + units(b, es)) best = &b;
  return best;
}
// Whether [first, last] lies inside one buffer or alias.
static bool inside_one(const ArenaMap &m, long first, long last, size_t es) {
  for (const Named &b : m.bufs)
    if (b.off <= first && last < b.off + units(b, es)) return true;
  return false;
}
static void check_arena_range(uintptr_t base, const Alloc *a, const void *p, size_t bytes, const char *what) {
  load_map();
  if (!arena_checks || a->kind != K_DEVICE) return;
  if ((uintptr_t)p == base && bytes == a->bytes) return; /* the whole arena (its zeroing at start-up) */
  const ArenaMap &m = hbm_span;
  size_t es = m.elems > 0 && a->bytes % (size_t)m.elems == 0 ? a->bytes / (size_t)m.elems : 0;
  if (m.bufs.empty() || m.elems <= 0 || (es != 2 && es != 4) || a->bytes != (size_t)m.elems * es) return;
  long first = (long)(((uintptr_t)p - base) / es), last = (long)(((uintptr_t)p + bytes - 1 - base) / es);
  const Named *b = buffer_at(m, first, es), *e = buffer_at(m, last, es);
  if (b && e && b != e && !inside_one(m, first, last, es))
    emu_warn("%s: units [%ld, %ld] of the HBM span run from %s (%ld + %ld) into %s", what, first, last,
             b->name.c_str(), b->off, units(*b, es), e->name.c_str());
}
static void check_dev_range(const void *p, size_t bytes, const char *what) {
  if (!bytes) return;
  uintptr_t base;
  const Alloc *a = find(p, &base);
  if (!a) return emu_error("%s: %p is %s memory, expected device memory", what, p, where_name(p));
  if ((uintptr_t)p + bytes > base + a->bytes)
    emu_error("%s: %zu bytes at %p run %zu bytes past the end of its %zu-byte allocation", what, bytes, p,
              (size_t)((uintptr_t)p + bytes - base - a->bytes), a->bytes);
  check_arena_range(base, a, p, bytes, what);
}
static void check_dev_ptr(const void *p, const char *what) {
  if (p && !find(p)) emu_error("%s: %p is pageable host memory, expected device memory", what, p);
}

static void *map_bytes(size_t bytes) {
  void *p = mmap(nullptr, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// EMU_PROTECT: device memory is readable only inside device operations (depth > 0).
static bool protecting() {
  static int p = env_int("EMU_PROTECT", 0);
  return p;
}
static int device_depth;
static void set_device_access(bool on) {
  for (auto &a : allocs)
    if (a.second.kind == K_DEVICE) mprotect((void *)a.first, a.second.bytes, on ? PROT_READ | PROT_WRITE : PROT_NONE);
}
static void enter_device(void) {
  if (protecting() && device_depth++ == 0) set_device_access(true);
}
static void leave_device(void) {
  if (protecting() && --device_depth == 0) set_device_access(false);
}
static void on_segv(int sig, siginfo_t *si, void *) {
  uintptr_t base;
  const Alloc *a = find(si->si_addr, &base);
  if (a && a->kind == K_DEVICE && device_depth == 0) {
    char msg[300];
    int n = snprintf(msg, sizeof msg,
                     "cuda-emu: ERROR: host code dereferenced device memory at %p (offset %zu of a %zu-byte "
                     "cudaMalloc allocation); backtrace:\n",
                     si->si_addr, (size_t)((uintptr_t)si->si_addr - base), a->bytes);
    if (write(2, msg, (size_t)n) < 0) {}
    void *bt[32];
    backtrace_symbols_fd(bt, backtrace(bt, 32), 2);
  }
  signal(sig, SIG_DFL); // the fault repeats and ends the process
}
static void install_protection(void) {
  static bool done;
  if (done || !protecting()) return;
  done = true;
  struct sigaction sa = {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigaction(SIGSEGV, &sa, nullptr);
}

// ---- errors: the last one, as cudaGetLastError reports it ----
static cudaError_t last_error = cudaSuccess;
static cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

// ---- streams: queues of operations (run at once in sync mode) ----
struct CUstream_st {
  unsigned magic;
  bool nonblocking;
  std::deque<std::function<void()>> q;
  std::deque<std::string> names;
  long issued, done; // operations issued and run
  long stuck_at;      // >= 0: an operation that never completes (EMU_NCCL_FAIL/HANG); events from here on never do
};
struct CUevent_st {
  unsigned magic;
  CUstream_st *stream; // where it was last recorded (nullptr: never)
  long seq;            // the number of that stream's operations before it
};
enum { STREAM_MAGIC = 0x57524d53, EVENT_MAGIC = 0x45564e54 };
static CUstream_st legacy = {STREAM_MAGIC, false, {}, {}, 0, 0};
static std::vector<CUstream_st *> streams = {&legacy};
static bool lazy() {
  static int l = -1;
  if (l < 0) {
    const char *e = getenv("EMU_STREAMS");
    l = e && strcmp(e, "lazy") == 0;
  }
  return l;
}

static CUstream_st *stream_of(cudaStream_t s, const char *what) {
  if (!s || s == cudaStreamLegacy) return &legacy;
  if (s == cudaStreamPerThread) return &legacy;
  if (s->magic != STREAM_MAGIC) emu_error("%s: %p is not a live stream", what, (void *)s);
  return s;
}

static long queued;     // lazy mode: operations that waited in a queue
static size_t max_queue; // and the longest queue
static void flush(CUstream_st *s, long upto);
static void flush_blocking(void) { // what the legacy stream waits for: every blocking stream
  for (CUstream_st *t : streams)
    if (t != &legacy && !t->nonblocking) flush(t, t->issued);
}
static int flush_depth;
static void flush(CUstream_st *s, long upto) {
  if (++flush_depth > 64) emu_error("stream dependencies form a cycle");
  while (s->done < upto) {
    std::function<void()> op = std::move(s->q.front());
    s->q.pop_front(), s->names.pop_front();
    s->done++;
    enter_device();
    op();
    leave_device();
  }
  flush_depth--;
}
static void flush_all(void) {
  for (CUstream_st *t : streams) flush(t, t->issued);
}
// Issues op on stream s: run now (sync mode, or the legacy stream after the blocking streams),
// or queued (lazy mode).
static void issue(CUstream_st *s, const char *name, std::function<void()> op) {
  if (!lazy() || s == &legacy) {
    if (lazy()) flush_blocking();
    s->issued++, s->done++;
    enter_device();
    op();
    leave_device();
    return;
  }
  s->q.push_back(std::move(op)), s->names.push_back(name);
  s->issued++;
  queued++;
  if (s->q.size() > max_queue) max_queue = s->q.size();
}

// ---- device, versions ----
static int device = 0;
static int n_devices(void) { return env_int("EMU_GPUS", 8); }

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
  *count = n_devices();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  trace("cudaSetDevice(%d)", d);
  if (d < 0 || d >= n_devices()) return fail(cudaErrorInvalidDevice);
  device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
  *d = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int d) {
  if (d < 0 || d >= n_devices()) return fail(cudaErrorInvalidDevice);
  switch (attr) {
  case cudaDevAttrComputeCapabilityMajor: *value = env_int("EMU_CC", 90) / 10; break;
  case cudaDevAttrComputeCapabilityMinor: *value = env_int("EMU_CC", 90) % 10; break;
  case cudaDevAttrMultiProcessorCount: *value = 132; break;
  case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
  case cudaDevAttrWarpSize: *value = 32; break;
  case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 << 10; break;
  default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
  if (d < 0 || d >= n_devices()) return fail(cudaErrorInvalidDevice);
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "CPU emulation of an sm_%d GPU (tests/cuda_emu)", env_int("EMU_CC", 90));
  p->totalGlobalMem = TOTAL, p->major = env_int("EMU_CC", 90) / 10, p->minor = env_int("EMU_CC", 90) % 10;
  p->multiProcessorCount = 132;
  p->warpSize = 32, p->maxThreadsPerBlock = 1024, p->sharedMemPerBlock = 48 << 10;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidDevicePointer: return "invalid device pointer";
  case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidKernelImage: return "device kernel image is invalid";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorSymbolNotFound: return "named symbol not found";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
  default: return "unknown error (cuda-emu)";
  }
}
const char *cudaGetErrorName(cudaError_t e) { return cudaGetErrorString(e); }
cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

// ---- memory ----
cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = nullptr;
  flush_all(); // cudaMalloc may synchronize; harmless here
  if (device_bytes + bytes > TOTAL) return fail(cudaErrorMemoryAllocation);
  void *m = map_bytes(bytes);
  if (!m) return fail(cudaErrorMemoryAllocation);
  if (env_int("EMU_POISON", 1)) memset(m, 0xff, bytes); // NaN floats, -1 ints: uninitialized reads show
  allocs[(uintptr_t)m] = {bytes ? bytes : 1, K_DEVICE};
  device_bytes += bytes;
  if (device_bytes > device_peak) device_peak = device_bytes;
  static bool reporting;
  if (!reporting && env_int("EMU_MEM_REPORT", 0)) reporting = true, (void)my_rank(), atexit(mem_report);
  install_protection();
  if (protecting() && device_depth == 0) mprotect(m, bytes ? bytes : 1, PROT_NONE);
  *p = m;
  trace("cudaMalloc(%zu) = %p", bytes, m);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) {
  *p = nullptr;
  void *m = map_bytes(bytes);
  if (!m) return fail(cudaErrorMemoryAllocation);
  if (env_int("EMU_POISON", 1)) memset(m, 0xff, bytes);
  allocs[(uintptr_t)m] = {bytes ? bytes : 1, K_PINNED};
  pinned_bytes += bytes;
  if (pinned_bytes > pinned_peak) pinned_peak = pinned_bytes;
  *p = m;
  trace("cudaMallocHost(%zu) = %p", bytes, m);
  return cudaSuccess;
}
static cudaError_t free_kind(void *p, Kind kind, const char *what) {
  if (!p) return cudaSuccess;
  flush_all(); // cudaFree synchronizes the device
  auto it = allocs.find((uintptr_t)p);
  if (it == allocs.end() || it->second.kind != kind) {
    emu_error("%s(%p): not the start of a live %s allocation (%s memory)", what, p,
              kind == K_DEVICE ? "device" : "pinned", where_name(p));
    return fail(cudaErrorInvalidValue);
  }
  if (kind == K_DEVICE) device_bytes -= it->second.bytes;
  else pinned_bytes -= it->second.bytes;
  munmap(p, it->second.bytes);
  allocs.erase(it);
  return cudaSuccess;
}
cudaError_t cudaFree(void *p) { return free_kind(p, K_DEVICE, "cudaFree"); }
cudaError_t cudaFreeHost(void *p) { return free_kind(p, K_PINNED, "cudaFreeHost"); }
cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
  *total = TOTAL, *fr = TOTAL - device_bytes;
  return cudaSuccess;
}

// Checks a copy's pointers against its kind; returns the kind with Default resolved.
static cudaMemcpyKind check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind, const char *what) {
  const Alloc *d = find(dst), *s = find(src);
  bool dd = d && d->kind == K_DEVICE, sd = s && s->kind == K_DEVICE;
  if (kind == cudaMemcpyDefault)
    kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice) : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  static const char *const kn[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"};
  if (want_dd != dd || want_sd != sd)
    emu_error("%s: cudaMemcpy%s from %s to %s memory (%zu bytes)", what, kn[kind], where_name(src), where_name(dst), n);
  if (d) check_dev_range(dst, n, what);
  if (s) check_dev_range(src, n, what);
  if (n && (char *)dst < (const char *)src + n && (const char *)src < (char *)dst + n)
    emu_error("%s: source and destination overlap (%zu bytes, %p and %p)", what, n, src, dst);
  return kind;
}

// Pageable asynchronous copies (cudaMemcpyAsync from or to host memory that is not pinned) are
// refused: CUDA may take such a source later than the call (GH200 reads pageable memory over
// C2C), may block, and cannot capture them in a graph. EMU_PAGEABLE_OK lists the call sites still
// allowed, comma-separated FILE:FUNCTION as addr2line names the runtime's caller (inlined frames
// too); unset, the known offenders below (none: the runtime has no pageable async copy left).
static const char *const known_pageable = "";
// "FILE:FUNCTION" of the frames at return address ret, innermost first (addr2line -f -i -s), cached.
static const std::vector<std::string> &frames_at(void *ret) {
  static std::map<void *, std::vector<std::string>> cache;
  auto it = cache.find(ret);
  if (it != cache.end()) return it->second;
  std::vector<std::string> &out = cache[ret];
  Dl_info di;
  if (!dladdr(ret, &di) || !di.dli_fname) return out;
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "addr2line -f -i -s -e '%s' 0x%lx 2>/dev/null", di.dli_fname,
           (unsigned long)((uintptr_t)ret - 1 - (uintptr_t)di.dli_fbase));
  FILE *f = popen(cmd, "r");
  char fn[512], fl[512];
  while (f && fgets(fn, sizeof fn, f) && fgets(fl, sizeof fl, f)) {
    fn[strcspn(fn, "\n")] = 0;
    char *colon = strchr(fl, ':');
    if (colon) *colon = 0;
    out.push_back(std::string(fl) + ":" + fn);
  }
  if (f) pclose(f);
  return out;
}
// Whether the caller of this copy (the first frame outside this file) is in EMU_PAGEABLE_OK.
static bool pageable_allowed(std::string *site) {
  const char *list = getenv("EMU_PAGEABLE_OK") ? getenv("EMU_PAGEABLE_OK") : known_pageable;
  void *bt[8];
  int n = backtrace(bt, 8);
  for (int i = 1; i < n; i++) {
    const std::vector<std::string> &fr = frames_at(bt[i]);
    bool ours = false;
    for (const std::string &x : fr) ours |= x.rfind("fake_cuda.cpp:", 0) == 0;
    if (ours || fr.empty()) continue;
    *site = fr[0];
    for (const std::string &x : fr) {
      std::string l = std::string(",") + list + ",";
      if (l.find("," + x + ",") != std::string::npos) return true;
    }
    return false;
  }
  *site = "(unknown)";
  return false;
}

// EMU_COUNTS_BY=1: counts one `kind` ("kernel", "blas", "memset") under `name` and the first three
// frames outside this file ("FILE:FUNCTION", inlined ones included, innermost first), as counts_by's key.
static void count_by(const char *kind, const char *name) {
  static int on = env_int("EMU_COUNTS_BY", 0);
  if (!on || !counting) return;
  void *bt[10];
  int n = backtrace(bt, 10), got = 0;
  std::string key = std::string(kind) + " " + name;
  for (int i = 1; i < n && got < 2; i++) {
    const std::vector<std::string> &fr = frames_at(bt[i]);
    bool ours = false;
    for (const std::string &x : fr) ours |= x.rfind("fake_cuda.cpp:", 0) == 0;
    if (ours || fr.empty()) continue;
    for (size_t j = 0; j < fr.size() && got < 3; j++) /* (the runtime's launch helpers name no op) */
      if (fr[j].find(":cu_launch") == std::string::npos) key += (got++ ? " < " : " @ ") + fr[j];
  }
  counts_by[key]++;
}

static cudaError_t memcpy_on(CUstream_st *st, void *dst, const void *src, size_t n, cudaMemcpyKind kind, bool async,
                             const char *what) {
  trace("%s(%p <- %p, %zu, kind %d)", what, dst, src, n, (int)kind);
  if (!n) return cudaSuccess;
  kind = check_copy(dst, src, n, kind, what);
  const Alloc *s = find(src), *d = find(dst);
  bool pageable_src = !s, pageable_dst = !d;
  if (counting) {
    counts.copies++;
    if (kind == cudaMemcpyHostToDevice) counts.bytes_h2d += n;
    else if (kind == cudaMemcpyDeviceToHost) counts.bytes_d2h += n;
    else if (kind == cudaMemcpyDeviceToDevice) counts.bytes_d2d += n;
  }
  if (async && ((pageable_src && kind == cudaMemcpyHostToDevice) || (pageable_dst && kind == cudaMemcpyDeviceToHost))) {
    if (counting) counts.pageable_copies++;
    std::string site;
    if (!pageable_allowed(&site))
      emu_error("%s at %s: %zu bytes %s pageable host memory %p; expected pinned memory (cudaMallocHost) left "
                "untouched until an event says the copy is done (EMU_PAGEABLE_OK lists allowed call sites)",
                what, site.c_str(), n, kind == cudaMemcpyHostToDevice ? "from" : "into",
                kind == cudaMemcpyHostToDevice ? src : (const void *)dst);
  }
  if (pageable_src && kind == cudaMemcpyHostToDevice) { // CUDA takes a pageable source at the call
    std::shared_ptr<std::vector<char>> copy = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
    issue(st, what, [=] { memcpy(dst, copy->data(), n); });
  } else {
    issue(st, what, [=] { memcpy(dst, src, n); });
  }
  // a copy to pageable memory, and every cudaMemcpy, returns when done
  if (!async || (pageable_dst && kind == cudaMemcpyDeviceToHost)) flush(st, st->issued), host_sync(what);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  return memcpy_on(&legacy, dst, src, n, kind, false, "cudaMemcpy");
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  return memcpy_on(stream_of(s, "cudaMemcpyAsync"), dst, src, n, kind, true, "cudaMemcpyAsync");
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
  trace("cudaMemset(%p, %d, %zu)", p, v, n);
  check_dev_range(p, n, "cudaMemset");
  if (counting) counts.memsets++, counts.bytes_memset += n;
  count_by("memset", "cudaMemset");
  issue(&legacy, "cudaMemset", [=] { memset(p, v, n); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  trace("cudaMemsetAsync(%p, %d, %zu)", p, v, n);
  check_dev_range(p, n, "cudaMemsetAsync");
  if (counting) counts.memsets++, counts.bytes_memset += n;
  count_by("memset", "cudaMemsetAsync");
  issue(stream_of(s, "cudaMemsetAsync"), "cudaMemsetAsync", [=] { memset(p, v, n); });
  return cudaSuccess;
}

// ---- streams and events ----
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
  CUstream_st *t = new CUstream_st{STREAM_MAGIC, (flags & cudaStreamNonBlocking) != 0, {}, {}, 0, 0, -1};
  streams.push_back(t);
  *s = t;
  trace("cudaStreamCreate(%s) = %p", t->nonblocking ? "non-blocking" : "blocking", (void *)t);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  CUstream_st *t = stream_of(s, "cudaStreamDestroy");
  if (t == &legacy) return fail(cudaErrorInvalidResourceHandle);
  flush(t, t->issued); // its work completes
  t->magic = 0;
  for (size_t i = 0; i < streams.size(); i++)
    if (streams[i] == t) streams.erase(streams.begin() + (long)i);
  return cudaSuccess; // the object is kept: a late use of the handle reports instead of crashing
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  CUstream_st *t = stream_of(s, "cudaStreamSynchronize");
  host_sync("cudaStreamSynchronize");
  if (t == &legacy) flush_blocking();
  flush(t, t->issued);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }
cudaError_t cudaDeviceSynchronize(void) {
  host_sync("cudaDeviceSynchronize");
  flush_all();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
  *e = new CUevent_st{EVENT_MAGIC, nullptr, 0};
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
static CUevent_st *event_of(cudaEvent_t e, const char *what) {
  if (!e || e->magic != EVENT_MAGIC) {
    emu_error("%s: %p is not a live event", what, (void *)e);
    return nullptr;
  }
  return e;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (CUevent_st *v = event_of(e, "cudaEventDestroy")) v->magic = 0;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  CUevent_st *v = event_of(e, "cudaEventRecord");
  CUstream_st *t = stream_of(s, "cudaEventRecord");
  if (v) v->stream = t, v->seq = t->issued;
  return cudaSuccess;
}
static void complete(CUevent_st *v) {
  if (v && v->stream && v->stream->magic == STREAM_MAGIC) flush(v->stream, v->seq);
}
// Whether event v follows an operation that never completes (fault injection).
static bool stuck(const CUevent_st *v) {
  return v && v->stream && v->stream->magic == STREAM_MAGIC && v->stream->stuck_at >= 0 && v->seq >= v->stream->stuck_at;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { // lazy mode: the work before the event runs now
  host_sync("cudaEventQuery"); // a poll: the callers here loop on it until the event is done
  CUevent_st *v = event_of(e, "cudaEventQuery");
  if (stuck(v)) return cudaErrorNotReady;
  complete(v);
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  host_sync("cudaEventSynchronize");
  complete(event_of(e, "cudaEventSynchronize"));
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  CUstream_st *t = stream_of(s, "cudaStreamWaitEvent");
  CUevent_st *v = event_of(e, "cudaStreamWaitEvent");
  if (!v || !v->stream) return cudaSuccess; // never recorded: nothing to wait for
  if (stuck(v)) { // t waits for an operation that never completes: so does t
    issue(t, "cudaStreamWaitEvent", [] {});
    if (t->stuck_at < 0) t->stuck_at = t->issued;
    return cudaSuccess;
  }
  CUstream_st *src = v->stream;
  long seq = v->seq;
  issue(t, "cudaStreamWaitEvent", [=] {
    if (src->magic == STREAM_MAGIC) flush(src, seq);
  });
  return cudaSuccess;
}

// ---- kernels ----
// Kernel variants: the kernels.cu compiled into this build (emu_kernels.cpp, when the build has
// one: weak), and any other source the runtime hands NVRTC, compiled for the CPU on first use
// (jit below). rt_cuda_compile is wrapped (-Wl,--wrap=rt_cuda_compile) to learn which source a
// CUBIN came from; cudaLibraryLoadData then picks the variant of that source.
extern "C" {
extern const EmuKernel emu_kernels[] __attribute__((weak));
extern const int emu_nkernels __attribute__((weak));
extern const unsigned char emu_kernels_source[] __attribute__((weak));
extern const unsigned long emu_kernels_source_len __attribute__((weak));
}
struct Variant {
  std::string source;
  const EmuKernel *k;
  int n;
};
static std::vector<Variant *> variants;
static std::vector<std::pair<const void *, std::string>> cubin_sources; // CUBIN pointer -> its source

static uint64_t fnv1a(const std::string &s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// source compiled for the CPU as a shared object (cached by hash), loaded, its kernel table.
// -Bsymbolic: the object's kernel table must point at its own kernels, not at the same-named
// built-in ones the program exports (-rdynamic), which the dynamic linker would otherwise pick
// first (a bf16 build's built-in kernels then ran for an fp32-activation program's variant).
static Variant *jit(const std::string &source) {
#ifndef EMU_SRC_DIR
  emu_error("kernels.cu differs from the one compiled into the emulation, and this build cannot compile another");
  return nullptr;
#else
  const char *cache = getenv("EMU_JIT_DIR");
  std::string dir = cache ? cache : std::string(getenv("MTC_KERNEL_CACHE") ? getenv("MTC_KERNEL_CACHE") : "/tmp") + "/cuda-emu-jit";
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)fnv1a(source + EMU_JIT_FLAGS + " -Bsymbolic"));
  // the intermediates carry the process id: ranks that start together compile the same variant
  // side by side (each renames its own .so into place) instead of writing over each other's lists
  std::string so = dir + "/" + hash + ".so", base = dir + "/" + hash + "." + std::to_string((long)getpid());
  if (access(so.c_str(), R_OK) != 0) {
    std::string mk = "mkdir -p '" + dir + "'";
    if (system(mk.c_str()) != 0) {}
    FILE *f = fopen((base + ".cu").c_str(), "wb");
    if (!f || fwrite(source.data(), 1, source.size(), f) != source.size() || fclose(f) != 0) {
      emu_error("jit: cannot write %s.cu", base.c_str());
      return nullptr;
    }
    std::string cmd = std::string("bash '") + EMU_SRC_DIR + "/gen_kernel_list.sh' '" + base + ".cu' '" + base +
                      ".inc' '" + EMU_CXX + "' && '" + EMU_CXX + "' -std=c++17 -O2 -g -fPIC -shared -Wl,-Bsymbolic -fno-strict-aliasing " +
                      EMU_JIT_FLAGS + " -I'" + EMU_SRC_DIR + "/fakeinc' -I'" + EMU_SRC_DIR + "' -DEMU_KERNELS_CU='\"" + base +
                      ".cu\"' -DEMU_KERNEL_LIST='\"" + base + ".inc\"' -DEMU_KERNEL_SOURCE='\"" + base + ".inc.src\"' " +
                      "-Demu_kernels=emu_jit_kernels " +
                      "-Demu_nkernels=emu_jit_nkernels -Demu_kernels_source=emu_jit_source " +
                      "-Demu_kernels_source_len=emu_jit_source_len '" + EMU_SRC_DIR + "/emu_kernels.cpp' -o '" + base +
                      ".so' && mv '" + base + ".so' '" + so + "'";
    fprintf(stderr, "cuda-emu[%d]: compiling a kernels.cu variant for the CPU (%s.cu)\n", my_rank(), base.c_str());
    if (system(cmd.c_str()) != 0) {
      emu_error("jit: compiling %s.cu for the CPU failed", base.c_str());
      return nullptr;
    }
  }
  void *h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  const EmuKernel *k = h ? (const EmuKernel *)dlsym(h, "emu_jit_kernels") : nullptr;
  const int *n = h ? (const int *)dlsym(h, "emu_jit_nkernels") : nullptr;
  if (!k || !n) {
    emu_error("jit: cannot load %s: %s", so.c_str(), dlerror());
    return nullptr;
  }
  Variant *v = new Variant{source, k, *n};
  variants.push_back(v);
  return v;
#endif
}

static Variant *variant_of(const void *code) {
  if (variants.empty() && &emu_nkernels && emu_nkernels > 0 && &emu_kernels_source)
    variants.push_back(new Variant{std::string((const char *)emu_kernels_source, emu_kernels_source_len), emu_kernels, emu_nkernels});
  const std::string *src = nullptr;
  for (auto it = cubin_sources.rbegin(); it != cubin_sources.rend() && !src; ++it)
    if (it->first == code) src = &it->second;
  if (!src) { // no record of the source: the built-in kernels, if any
    if (!variants.empty()) return variants[0];
    emu_error("cudaLibraryLoadData: a CUBIN not made by rt_cuda_compile, and no kernels are built in");
    return nullptr;
  }
  for (Variant *v : variants)
    if (v->source == *src) return v;
  return jit(*src);
}

struct CUlib_st {
  unsigned magic;
  std::vector<char> image;
  Variant *v;
};
enum { LIB_MAGIC = 0x4c494252 };

// the runtime's NVRTC loader, wrapped: which source each CUBIN it returns came from
extern "C" int __real_rt_cuda_compile(const char *src, size_t n, const char *name, const char *arch,
                                      const char *include_dir, const char *cache_dir, void **cubin, size_t *cubin_bytes,
                                      int *kernels, int *cached, char *log, size_t loglen);
extern "C" int __wrap_rt_cuda_compile(const char *src, size_t n, const char *name, const char *arch,
                                      const char *include_dir, const char *cache_dir, void **cubin, size_t *cubin_bytes,
                                      int *kernels, int *cached, char *log, size_t loglen) {
  int rc = __real_rt_cuda_compile(src, n, name, arch, include_dir, cache_dir, cubin, cubin_bytes, kernels, cached, log,
                                  loglen);
  if (rc == 0 && cubin && *cubin) cubin_sources.push_back({*cubin, std::string(src, n)});
  return rc;
}

cudaError_t cudaLibraryLoadData(cudaLibrary_t *lib, const void *code, enum cudaJitOption *, void **, unsigned,
                                enum cudaLibraryOption *, void **, unsigned) {
  *lib = nullptr;
  const char *c = (const char *)code;
  if (!c || memcmp(c, "\x7f" "ELF", 4) != 0) {
    emu_error("cudaLibraryLoadData: the image is not an ELF CUBIN");
    return fail(cudaErrorInvalidKernelImage);
  }
  Variant *v = variant_of(code);
  if (!v) return fail(cudaErrorInvalidKernelImage);
  // ELF64: section headers at e_shoff (8 bytes at 0x28), e_shentsize at 0x3a, e_shnum at 0x3c
  uint64_t shoff;
  uint16_t shentsize, shnum;
  memcpy(&shoff, c + 0x28, 8), memcpy(&shentsize, c + 0x3a, 2), memcpy(&shnum, c + 0x3c, 2);
  size_t bytes = shoff + (size_t)shentsize * shnum;
  *lib = new CUlib_st{LIB_MAGIC, std::vector<char>(c, c + bytes), v};
  trace("cudaLibraryLoadData: %zu bytes, %d kernels", bytes, v->n);
  return cudaSuccess;
}
cudaError_t cudaLibraryUnload(cudaLibrary_t lib) {
  if (!lib || lib->magic != LIB_MAGIC) return fail(cudaErrorInvalidResourceHandle);
  flush_all();
  lib->magic = 0;
  return cudaSuccess;
}
// A kernel: in the CUBIN's string table, and in the library's variant.
cudaError_t cudaLibraryGetKernel(cudaKernel_t *k, cudaLibrary_t lib, const char *name) {
  *k = nullptr;
  if (!lib || lib->magic != LIB_MAGIC) return fail(cudaErrorInvalidResourceHandle);
  std::string key = std::string(name) + '\0';
  bool in_cubin = false;
  for (size_t i = 0; i + key.size() <= lib->image.size() && !in_cubin; i++)
    in_cubin = (i == 0 || lib->image[i - 1] == 0) && memcmp(&lib->image[i], key.data(), key.size()) == 0;
  for (int i = 0; i < lib->v->n; i++)
    if (strcmp(lib->v->k[i].name, name) == 0) {
      if (!in_cubin) {
        emu_warn("kernel %s is compiled into the emulation but not in the CUBIN NVRTC made", name);
        return fail(cudaErrorSymbolNotFound);
      }
      *k = (cudaKernel_t)&lib->v->k[i];
      return cudaSuccess;
    }
  if (in_cubin) emu_warn("kernel %s is in the CUBIN but not in the emulation's kernels.cu", name);
  return fail(cudaErrorSymbolNotFound);
}

static long launches;
static int late_sleep; // seconds the next cudaLaunchKernel sleeps (EMU_NCCL_LATE), then 0
cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shared, cudaStream_t s) {
  const EmuKernel *k = (const EmuKernel *)func;
  if (late_sleep) { // EMU_NCCL_LATE: the host busy after a hung NCCL operation (fault injection)
    fprintf(stderr, "cuda-emu[%d]: EMU_NCCL_LATE: the host sleeps %d s before launching %s\n", my_rank(), late_sleep,
            k && k->magic == EMU_KERNEL_MAGIC ? k->name : "a kernel");
    sleep((unsigned)late_sleep), late_sleep = 0;
  }
  if (!k || k->magic != EMU_KERNEL_MAGIC) {
    emu_error("cudaLaunchKernel: %p is not a kernel from cudaLibraryGetKernel", func);
    return fail(cudaErrorInvalidValue);
  }
  trace("launch %s grid (%u,%u,%u) block (%u,%u,%u)", k->name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
  unsigned threads = block.x * block.y * block.z;
  if (!grid.x || !grid.y || !grid.z || !threads || threads > 1024 || grid.y > 65535 || grid.z > 65535 ||
      block.z > 64) {
    emu_error("kernel %s: launch with grid (%u,%u,%u) block (%u,%u,%u): invalid configuration", k->name, grid.x, grid.y,
              grid.z, block.x, block.y, block.z);
    return fail(cudaErrorInvalidConfiguration);
  }
  if (k->launch_bounds && threads > (unsigned)k->launch_bounds) {
    emu_error("kernel %s: %u threads per block, more than its __launch_bounds__(%d)", k->name, threads, k->launch_bounds);
    return fail(cudaErrorLaunchOutOfResources);
  }
  if (shared > 0) emu_warn("kernel %s: %zu bytes of dynamic shared memory (not emulated: static only)", k->name, shared);
  CUstream_st *st = stream_of(s, "cudaLaunchKernel");
  // the arguments are taken at the launch, as CUDA does; pointers must be device-readable
  std::shared_ptr<std::vector<uint64_t>> vals = std::make_shared<std::vector<uint64_t>>(k->nparams);
  for (int i = 0; i < k->nparams; i++) {
    memcpy(&(*vals)[i], args[i], k->size[i]);
    if (k->is_ptr[i]) {
      void *p;
      memcpy(&p, args[i], sizeof p);
      char what[160];
      snprintf(what, sizeof what, "kernel %s, parameter %d", k->name, i);
      check_dev_ptr(p, what);
    }
  }
  launches++;
  if (counting) counts.launches++;
  count_by("kernel", k->name);
  EmuDim g = {grid.x, grid.y, grid.z}, b = {block.x, block.y, block.z};
  issue(st, k->name, [=] {
    void *a[EMU_MAX_PARAMS];
    for (int i = 0; i < k->nparams; i++) a[i] = &(*vals)[i];
    cur_kernel = k->name;
    emu_run_grid(k, a, g, b);
    cur_kernel = "(host)";
  });
  return cudaSuccess;
}

} // extern "C"

// ---- cuBLAS over OpenBLAS ----
struct cublasContext {
  unsigned magic;
  cudaStream_t stream;
};
enum { BLAS_MAGIC = 0x424c4153 };

static float round_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f;
  u += 0x7fffu + ((u >> 16) & 1);
  u &= 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}
static float round_tf32(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f;
  u += 0xfffu + ((u >> 13) & 1);
  u &= 0xffffe000u;
  memcpy(&f, &u, 4);
  return f;
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

// One column-major GEMM as cuBLAS defines it: C (m × n, ldc) = alpha op(A) op(B) + beta C.
struct Gemm {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
  float alpha, beta;
  const void *A, *B;
  void *C;
  cudaDataType_t at, bt, ct;
  cublasComputeType_t compute;
};

static size_t elem(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }
// Elements a (rows × cols, ld) spans in memory.
static size_t span(int rows, int cols, int ld) { return rows && cols ? (size_t)ld * (cols - 1) + rows : 0; }

static cublasStatus_t check_gemm(const Gemm &g, const char *what) {
  int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
  int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
  if (g.m < 0 || g.n < 0 || g.k < 0 || g.lda < (ar > 1 ? ar : 1) || g.ldb < (br > 1 ? br : 1) ||
      g.ldc < (g.m > 1 ? g.m : 1) || (g.ta != CUBLAS_OP_N && g.ta != CUBLAS_OP_T) ||
      (g.tb != CUBLAS_OP_N && g.tb != CUBLAS_OP_T)) {
    emu_warn("%s: invalid shape m %d n %d k %d lda %d ldb %d ldc %d (CUBLAS_STATUS_INVALID_VALUE)", what, g.m, g.n, g.k,
             g.lda, g.ldb, g.ldc);
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  bool fp32 = g.at == CUDA_R_32F && g.bt == CUDA_R_32F && g.ct == CUDA_R_32F;
  bool bf = g.at == CUDA_R_16BF && g.bt == CUDA_R_16BF && (g.ct == CUDA_R_16BF || g.ct == CUDA_R_32F);
  bool ok = (fp32 && (g.compute == CUBLAS_COMPUTE_32F || g.compute == CUBLAS_COMPUTE_32F_FAST_16BF ||
                      g.compute == CUBLAS_COMPUTE_32F_FAST_TF32 || g.compute == CUBLAS_COMPUTE_32F_PEDANTIC)) ||
            (bf && g.compute == CUBLAS_COMPUTE_32F);
  if (!ok) {
    emu_warn("%s: types A %d B %d C %d with compute type %d are not supported (emulated cuBLAS)", what, g.at, g.bt, g.ct,
             g.compute);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  char w[200];
  size_t ab = span(ar, ac, g.lda) * elem(g.at), bb = span(br, bc, g.ldb) * elem(g.bt), cb = span(g.m, g.n, g.ldc) * elem(g.ct);
  snprintf(w, sizeof w, "%s: A", what), check_dev_range(g.A, ab, w);
  snprintf(w, sizeof w, "%s: B", what), check_dev_range(g.B, bb, w);
  snprintf(w, sizeof w, "%s: C", what), check_dev_range(g.C, cb, w);
  auto overlap = [](const void *p, size_t n, const void *q, size_t m) {
    return n && m && (const char *)p < (const char *)q + m && (const char *)q < (const char *)p + n;
  };
  if (g.k && (overlap(g.C, cb, g.A, ab) || overlap(g.C, cb, g.B, bb)))
    emu_error("%s: C overlaps A or B (cuBLAS's result is undefined then)", what);
  return CUBLAS_STATUS_SUCCESS;
}

// fp32 copy of a (rows × cols, ld) operand, rounded as the compute type says.
static std::vector<float> operand(const void *p, cudaDataType_t t, int rows, int cols, int ld, cublasComputeType_t c) {
  size_t n = span(rows, cols, ld);
  std::vector<float> v(n);
  if (t == CUDA_R_16BF)
    for (size_t i = 0; i < n; i++) v[i] = from_bf16(((const uint16_t *)p)[i]);
  else
    memcpy(v.data(), p, n * 4);
  int round = env_int("EMU_GEMM_ROUND", 1);
  if (round && c == CUBLAS_COMPUTE_32F_FAST_16BF)
    for (float &x : v) x = round_bf16(x);
  if (round && c == CUBLAS_COMPUTE_32F_FAST_TF32)
    for (float &x : v) x = round_tf32(x);
  return v;
}

static void run_gemm(const Gemm &g) {
  if (!g.m || !g.n) return;
  int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
  int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
  bool plain = g.at == CUDA_R_32F && g.bt == CUDA_R_32F && g.ct == CUDA_R_32F &&
               (g.compute == CUBLAS_COMPUTE_32F || g.compute == CUBLAS_COMPUTE_32F_PEDANTIC || !env_int("EMU_GEMM_ROUND", 1));
  CBLAS_TRANSPOSE ta = g.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, tb = g.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
  if (plain) {
    cblas_sgemm(CblasColMajor, ta, tb, g.m, g.n, g.k, g.alpha, (const float *)g.A, g.lda, (const float *)g.B, g.ldb,
                g.beta, (float *)g.C, g.ldc);
    return;
  }
  std::vector<float> a = operand(g.A, g.at, ar, ac, g.lda, g.compute), b = operand(g.B, g.bt, br, bc, g.ldb, g.compute);
  if (g.ct == CUDA_R_32F) {
    cblas_sgemm(CblasColMajor, ta, tb, g.m, g.n, g.k, g.alpha, a.data(), g.lda, b.data(), g.ldb, g.beta, (float *)g.C,
                g.ldc);
    return;
  }
  std::vector<float> c = operand(g.C, g.ct, g.m, g.n, g.ldc, CUBLAS_COMPUTE_32F); // bf16 C: fp32 math, rounded back
  if (g.beta == 0) std::fill(c.begin(), c.end(), 0.f); // beta 0: C is not read (NaN stays out)
  cblas_sgemm(CblasColMajor, ta, tb, g.m, g.n, g.k, g.alpha, a.data(), g.lda, b.data(), g.ldb, g.beta, c.data(), g.ldc);
  for (int j = 0; j < g.n; j++)
    for (int i = 0; i < g.m; i++) ((uint16_t *)g.C)[(size_t)j * g.ldc + i] = to_bf16(c[(size_t)j * g.ldc + i]);
}

static cublasContext *handle_of(cublasHandle_t h, const char *what) {
  if (!h || h->magic != BLAS_MAGIC) {
    emu_error("%s: %p is not a live cuBLAS handle", what, (void *)h);
    return nullptr;
  }
  return h;
}

static float scalar(const void *p, const char *what) { // pointer mode host: alpha and beta live on the host
  if (find(p) && find(p)->kind == K_DEVICE) emu_error("%s: alpha or beta in device memory with CUBLAS_POINTER_MODE_HOST", what);
  return *(const float *)p;
}

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
  *h = new cublasContext{BLAS_MAGIC, nullptr};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
  if (!handle_of(h, "cublasDestroy")) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->magic = 0;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
  if (!handle_of(h, "cublasSetStream")) return CUBLAS_STATUS_NOT_INITIALIZED;
  stream_of(s, "cublasSetStream");
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes) {
  if (!handle_of(h, "cublasSetWorkspace")) return CUBLAS_STATUS_NOT_INITIALIZED;
  check_dev_range(ws, bytes, "cublasSetWorkspace");
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasGetProperty(libraryPropertyType type, int *v) {
  *v = type == MAJOR_VERSION ? 13 : type == MINOR_VERSION ? 0 : 0;
  return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
  case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  default: return "cuBLAS error (cuda-emu)";
  }
}
const char *cublasGetStatusName(cublasStatus_t s) { return cublasGetStatusString(s); }

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B, cudaDataType Btype,
                            int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo) {
  if (!handle_of(h, "cublasGemmEx")) return CUBLAS_STATUS_NOT_INITIALIZED;
  Gemm g = {ta, tb, m, n, k, lda, ldb, ldc, scalar(alpha, "cublasGemmEx"), scalar(beta, "cublasGemmEx"), A, B, C,
            Atype, Btype, Ctype, compute};
  trace("cublasGemmEx %c%c m %d n %d k %d lda %d ldb %d ldc %d beta %g compute %d", ta == CUBLAS_OP_N ? 'N' : 'T',
        tb == CUBLAS_OP_N ? 'N' : 'T', m, n, k, lda, ldb, ldc, g.beta, compute);
  cublasStatus_t s = check_gemm(g, "cublasGemmEx");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (counting) counts.blas++;
  count_by("blas", "cublasGemmEx");
  issue(stream_of(h->stream, "cublasGemmEx"), "cublasGemmEx", [=] { run_gemm(g); });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t transa[],
                                          const cublasOperation_t transb[], const int m[], const int n[], const int k[],
                                          const void *alpha, const void *const Aarray[], cudaDataType_t Atype,
                                          const int lda[], const void *const Barray[], cudaDataType_t Btype,
                                          const int ldb[], const void *beta, void *const Carray[], cudaDataType_t Ctype,
                                          const int ldc[], int group_count, const int group_size[],
                                          cublasComputeType_t compute) {
  const char *what = "cublasGemmGroupedBatchedEx";
  if (!handle_of(h, what)) return CUBLAS_STATUS_NOT_INITIALIZED;
  const char *refuse = getenv("EMU_GROUPED_REFUSE") ? getenv("EMU_GROUPED_REFUSE") : "16bf";
  if ((compute == CUBLAS_COMPUTE_32F_FAST_16BF && strstr(refuse, "16bf")) ||
      (compute == CUBLAS_COMPUTE_32F_FAST_TF32 && strstr(refuse, "tf32")))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (group_count < 0) return CUBLAS_STATUS_INVALID_VALUE;
  int total = 0;
  for (int i = 0; i < group_count; i++) total += group_size[i];
  // the pointer arrays: device memory, read when the GEMM runs; the shapes: host, read now
  check_dev_range(Aarray, sizeof(void *) * total, "cublasGemmGroupedBatchedEx: Aarray");
  check_dev_range(Barray, sizeof(void *) * total, "cublasGemmGroupedBatchedEx: Barray");
  check_dev_range(Carray, sizeof(void *) * total, "cublasGemmGroupedBatchedEx: Carray");
  std::vector<Gemm> gs;
  for (int i = 0; i < group_count; i++) {
    Gemm g = {transa[i], transb[i], m[i], n[i], k[i], lda[i], ldb[i], ldc[i], scalar((const float *)alpha + i, what),
              scalar((const float *)beta + i, what), nullptr, nullptr, nullptr, Atype, Btype, Ctype, compute};
    if (group_size[i] < 0) return CUBLAS_STATUS_INVALID_VALUE;
    for (int j = 0; j < group_size[i]; j++) gs.push_back(g);
  }
  for (Gemm &g : gs) { // shapes and types now (pointers are checked when they are read)
    Gemm t = g;
    t.A = t.B = t.C = nullptr;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    int ar = t.ta == CUBLAS_OP_N ? t.m : t.k, br = t.tb == CUBLAS_OP_N ? t.k : t.n;
    if (t.lda < (ar > 1 ? ar : 1) || t.ldb < (br > 1 ? br : 1) || t.ldc < (t.m > 1 ? t.m : 1) || t.m < 0 || t.n < 0 ||
        t.k < 0)
      s = CUBLAS_STATUS_INVALID_VALUE;
    bool fp32 = Atype == CUDA_R_32F && Btype == CUDA_R_32F && Ctype == CUDA_R_32F;
    bool bf = Atype == CUDA_R_16BF && Btype == CUDA_R_16BF && Ctype == CUDA_R_16BF;
    if (!((fp32 && (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                    compute == CUBLAS_COMPUTE_32F_FAST_16BF)) ||
          (bf && compute == CUBLAS_COMPUTE_32F)))
      s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  trace("%s: %d groups, %d GEMMs, compute %d", what, group_count, total, compute);
  if (counting) counts.blas++;
  count_by("blas", what);
  issue(stream_of(h->stream, what), what, [=]() mutable {
    for (int i = 0; i < total; i++) {
      gs[i].A = Aarray[i], gs[i].B = Barray[i], gs[i].C = Carray[i];
      char w[80];
      snprintf(w, sizeof w, "%s (GEMM %d of %d)", what, i, total);
      check_gemm(gs[i], w);
      run_gemm(gs[i]);
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

// batch GEMMs of one shape, matrix i's A, B and C at strides sa, sb, sc elements from the first
// (Muon's Newton-Schulz); each checked and run as cublasGemmEx runs one
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType Atype, int lda,
                                          long long sa, const void *B, cudaDataType Btype, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType Ctype, int ldc, long long sc,
                                          int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  const char *what = "cublasGemmStridedBatchedEx";
  if (!handle_of(h, what)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
  Gemm g0 = {ta, tb, m, n, k, lda, ldb, ldc, scalar(alpha, what), scalar(beta, what), A, B, C, Atype, Btype, Ctype,
             compute};
  trace("%s %c%c m %d n %d k %d batch %d strides %lld %lld %lld beta %g", what, ta == CUBLAS_OP_N ? 'N' : 'T',
        tb == CUBLAS_OP_N ? 'N' : 'T', m, n, k, batch, sa, sb, sc, g0.beta);
  std::vector<Gemm> gs;
  for (int i = 0; i < batch; i++) {
    Gemm g = g0;
    g.A = (const char *)A + (size_t)i * sa * elem(Atype), g.B = (const char *)B + (size_t)i * sb * elem(Btype);
    g.C = (char *)C + (size_t)i * sc * elem(Ctype);
    char w[96];
    snprintf(w, sizeof w, "%s (matrix %d of %d)", what, i, batch);
    cublasStatus_t s = check_gemm(g, w);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    gs.push_back(g);
  }
  if (counting) counts.blas++;
  count_by("blas", what);
  issue(stream_of(h->stream, what), what, [=] {
    for (const Gemm &g : gs) run_gemm(g);
  });
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"

// ---- NCCL over MPI ----
struct ncclComm {
  unsigned magic;
  MPI_Comm mpi;
  int rank, size;
  bool failed; // EMU_NCCL_FAIL: ncclCommGetAsyncError reports ncclRemoteError
};
enum { COMM_MAGIC = 0x4e43434c };

static MPI_Datatype mpi_type(ncclDataType_t t, size_t *bytes) {
  switch (t) {
  case ncclFloat32: *bytes = 4; return MPI_FLOAT;
  case ncclFloat64: *bytes = 8; return MPI_DOUBLE;
  case ncclInt32: *bytes = 4; return MPI_INT;
  case ncclBfloat16: *bytes = 2; return MPI_UINT16_T;
  case ncclFloat16: *bytes = 2; return MPI_UINT16_T;
  default: *bytes = 1; return MPI_BYTE;
  }
}

static ncclComm *comm_of(ncclComm_t c, const char *what) {
  if (!c || c->magic != COMM_MAGIC) {
    emu_error("%s: %p is not a live NCCL communicator", what, (void *)c);
    return nullptr;
  }
  return c;
}

struct P2P {
  bool send;
  void *buf;
  size_t count, bytes;
  MPI_Datatype type;
  int peer;
  ncclComm *comm;
  cudaStream_t stream;
};
static int group_depth;
static std::vector<P2P> group_ops;

static void run_p2p(std::vector<P2P> ops) {
  std::vector<MPI_Request> req(ops.size());
  for (size_t i = 0; i < ops.size(); i++) { // receives first, then sends: no ordering deadlock
    P2P &o = ops[i];
    if (!o.send) MPI_Irecv(o.buf, (int)o.count, o.type, o.peer, 77, o.comm->mpi, &req[i]);
  }
  for (size_t i = 0; i < ops.size(); i++) {
    P2P &o = ops[i];
    if (o.send) MPI_Isend(o.buf, (int)o.count, o.type, o.peer, 77, o.comm->mpi, &req[i]);
  }
  MPI_Waitall((int)req.size(), req.data(), MPI_STATUSES_IGNORE);
}

static ncclResult_t p2p(bool send, const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                        cudaStream_t s) {
  const char *what = send ? "ncclSend" : "ncclRecv";
  ncclComm *cm = comm_of(c, what);
  if (!cm) return ncclInvalidArgument;
  size_t es;
  MPI_Datatype mt = mpi_type(t, &es);
  if (peer < 0 || peer >= cm->size) {
    emu_error("%s: peer %d of a communicator of %d ranks", what, peer, cm->size);
    return ncclInvalidArgument;
  }
  if (count > (size_t)INT32_MAX) return ncclInvalidArgument;
  char w[100];
  snprintf(w, sizeof w, "%s to/from peer %d", what, peer);
  check_dev_range(buf, count * es, w);
  stream_of(s, what);
  trace("%s %zu values peer %d", what, count, peer);
  P2P o = {send, (void *)buf, count, count * es, mt, peer, cm, s};
  if (group_depth) {
    group_ops.push_back(o);
  } else {
    if (counting) counts.nccl++;
    issue(stream_of(s, what), what, [=] { run_p2p({o}); });
  }
  return ncclSuccess;
}

// Fault injection, to check the runtime's diagnosis of a dead peer: EMU_NCCL_FAIL=K makes this
// rank's K-th NCCL operation (a collective, or a group of sends and receives; counted from 1 over
// every communicator) never complete, as with a peer that died: it does not run, events recorded
// after it on its stream, or on a stream that waits for it, are never done (cudaEventQuery:
// cudaErrorNotReady), and its communicator reports ncclRemoteError (ncclCommGetAsyncError).
// EMU_NCCL_HANG=K: the same without the error (a hang: only a timeout ends it). Every rank of the
// program must drop the same operation (the same K), or the others wait for it in MPI.
// EMU_NCCL_LATE=S (with either): the host sleeps S seconds in its first kernel launch after that
// operation, as a host busy issuing compute before its next wait: the hung operation is S
// seconds old when that wait begins (the runtime's timeout counts from the issue).
static bool injected(ncclComm *c) {
  static long n, fail = env_int("EMU_NCCL_FAIL", 0), hang = env_int("EMU_NCCL_HANG", 0);
  if (!fail && !hang) return false;
  if (++n != (fail ? fail : hang)) return false;
  if (fail) c->failed = true;
  late_sleep = env_int("EMU_NCCL_LATE", 0);
  fprintf(stderr, "cuda-emu[%d]: EMU_NCCL_%s: NCCL operation %ld never completes\n", my_rank(), fail ? "FAIL" : "HANG", n);
  return true;
}
static void drop(cudaStream_t s, const char *what) { // an operation that never completes on s
  CUstream_st *t = stream_of(s, what);
  issue(t, what, [] {}); // (an operation: events recorded before it stay reachable)
  if (t->stuck_at < 0) t->stuck_at = t->issued;
}
// Collectives within a group run at ncclGroupEnd, in order, on the group's stream.
static std::vector<std::pair<cudaStream_t, std::function<void()>>> group_colls;
static void collective(cudaStream_t s, const char *what, ncclComm *c, std::function<void()> op) {
  stream_of(s, what);
  if (counting) counts.nccl++;
  if (group_depth) group_colls.push_back({s, op});
  else if (injected(c)) drop(s, what);
  else issue(stream_of(s, what), what, op);
}

// Device buffers of a collective: in-place is NCCL's layout or none at all.
static void check_coll(const char *what, const void *send, size_t sbytes, const void *recv, size_t rbytes, size_t inplace_off) {
  char w[120];
  snprintf(w, sizeof w, "%s: sendbuff", what), check_dev_range(send, sbytes, w);
  snprintf(w, sizeof w, "%s: recvbuff", what), check_dev_range(recv, rbytes, w);
  const char *s = (const char *)send, *r = (const char *)recv;
  if (s < r + rbytes && r < s + sbytes && s != r + inplace_off)
    emu_error("%s: send and receive buffers overlap without being in place (send %p, recv %p, in place would be recv + %zu "
              "bytes)", what, send, recv, inplace_off);
}

extern "C" {

ncclResult_t ncclGetVersion(int *v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclInvalidArgument: return "invalid argument (cuda-emu)";
  case ncclInvalidUsage: return "invalid usage (cuda-emu)";
  case ncclRemoteError: return "remote process exited or there was a network error (cuda-emu: EMU_NCCL_FAIL)";
  default: return "NCCL error (cuda-emu)";
  }
}
const char *ncclGetLastError(ncclComm_t) { return ""; }
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "cuda-emu");
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t *c, int nranks, ncclUniqueId id, int rank) {
  *c = nullptr;
  if (strcmp(id.internal, "cuda-emu") != 0) {
    emu_error("ncclCommInitRank: the unique id is not rank 0's (was it broadcast?)");
    return ncclInvalidArgument;
  }
  MPI_Comm m;
  MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &m); // every rank of the world joins (the only use here)
  int size, r;
  MPI_Comm_size(m, &size), MPI_Comm_rank(m, &r);
  if (size != nranks || r != rank) {
    emu_error("ncclCommInitRank: %d ranks, rank %d, but the MPI world has %d and this is %d", nranks, rank, size, r);
    return ncclInvalidArgument;
  }
  *c = new ncclComm{COMM_MAGIC, m, r, size};
  trace("ncclCommInitRank: rank %d of %d", r, size);
  return ncclSuccess;
}
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *) {
  *newcomm = nullptr;
  ncclComm *c = comm_of(comm, "ncclCommSplit");
  if (!c) return ncclInvalidArgument;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return ncclInvalidArgument;
  MPI_Comm m;
  MPI_Comm_split(c->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &m);
  if (m == MPI_COMM_NULL) return ncclSuccess;
  int size, r;
  MPI_Comm_size(m, &size), MPI_Comm_rank(m, &r);
  *newcomm = new ncclComm{COMM_MAGIC, m, r, size};
  trace("ncclCommSplit: color %d key %d -> rank %d of %d", color, key, r, size);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ncclComm *c = comm_of(comm, "ncclCommDestroy");
  if (!c) return ncclInvalidArgument;
  flush_all();
  MPI_Comm_free(&c->mpi);
  c->magic = 0;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { return comm ? ncclCommDestroy(comm) : ncclSuccess; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *r) {
  ncclComm *c = comm_of(comm, "ncclCommGetAsyncError");
  *r = c && c->failed ? ncclRemoteError : ncclSuccess;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int *n) {
  *n = comm->size;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *r) {
  *r = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t s) {
  ncclComm *c = comm_of(comm, "ncclAllGather");
  if (!c) return ncclInvalidArgument;
  size_t es;
  MPI_Datatype mt = mpi_type(t, &es);
  check_coll("ncclAllGather", send, count * es, recv, count * es * c->size, count * es * c->rank);
  trace("ncclAllGather %zu values x %d ranks", count, c->size);
  collective(s, "ncclAllGather", c, [=] {
    bool inplace = send == (char *)recv + count * es * c->rank;
    MPI_Allgather(inplace ? MPI_IN_PLACE : send, (int)count, mt, recv, (int)count, mt, c->mpi);
  });
  return ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s) {
  ncclComm *c = comm_of(comm, "ncclReduceScatter");
  if (!c) return ncclInvalidArgument;
  size_t es;
  MPI_Datatype mt = mpi_type(t, &es);
  if (op != ncclSum || (t != ncclFloat32 && t != ncclFloat64 && t != ncclBfloat16)) {
    emu_error("ncclReduceScatter: only sums of fp32, fp64 or bf16 are emulated");
    return ncclInvalidArgument;
  }
  check_coll("ncclReduceScatter", send, count * es * c->size, recv, count * es, (size_t)0 - count * es * c->rank);
  trace("ncclReduceScatter %zu values x %d ranks", count, c->size);
  if (t == ncclBfloat16) { // the g pieces of this rank's part summed in fp32 in rank order, rounded once
    collective(s, "ncclReduceScatter", c, [=] {
      size_t g = (size_t)c->size;
      std::vector<uint16_t> tmp((const uint16_t *)send, (const uint16_t *)send + count * g), got(count * g);
      MPI_Alltoall(tmp.data(), (int)count, MPI_UINT16_T, got.data(), (int)count, MPI_UINT16_T, c->mpi);
      for (size_t i = 0; i < count; i++) {
        float sum = 0;
        for (size_t r = 0; r < g; r++) sum += from_bf16(got[r * count + i]);
        ((uint16_t *)recv)[i] = to_bf16(sum);
      }
    });
    return ncclSuccess;
  }
  collective(s, "ncclReduceScatter", c, [=] {
    std::vector<char> tmp((const char *)send, (const char *)send + count * es * c->size); // in place or not
    MPI_Reduce_scatter_block(tmp.data(), recv, (int)count, mt, MPI_SUM, c->mpi);
  });
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t s) {
  ncclComm *c = comm_of(comm, "ncclAllReduce");
  if (!c) return ncclInvalidArgument;
  size_t es;
  MPI_Datatype mt = mpi_type(t, &es);
  if (op != ncclSum || (t != ncclFloat32 && t != ncclFloat64)) {
    emu_error("ncclAllReduce: only sums of fp32 or fp64 are emulated");
    return ncclInvalidArgument;
  }
  check_coll("ncclAllReduce", send, count * es, recv, count * es, 0);
  trace("ncclAllReduce %zu values", count);
  collective(s, "ncclAllReduce", c, [=] {
    MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, mt, MPI_SUM, c->mpi);
  });
  return ncclSuccess;
}
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s) {
  return p2p(true, buf, count, t, peer, comm, s);
}
ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s) {
  return p2p(false, buf, count, t, peer, comm, s);
}
ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  if (group_depth <= 0) {
    emu_error("ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--group_depth) return ncclSuccess;
  std::vector<P2P> ops;
  ops.swap(group_ops);
  std::vector<std::pair<cudaStream_t, std::function<void()>>> colls;
  colls.swap(group_colls);
  for (auto &c : colls) issue(stream_of(c.first, "ncclGroupEnd"), "nccl collective", c.second);
  if (ops.empty()) return ncclSuccess;
  if (counting) counts.nccl++; // one group of sends and receives
  cudaStream_t s = ops[0].stream;
  for (const P2P &o : ops)
    if (o.stream != s) emu_warn("ncclGroupEnd: send/recv of one group on different streams (emulated on the first)");
  if (injected(ops[0].comm)) drop(s, "ncclGroupEnd");
  else issue(stream_of(s, "ncclGroupEnd"), "nccl send/recv", [=] { run_p2p(ops); });
  return ncclSuccess;
}

} // extern "C"

// A summary at exit, when anything was reported.
static struct Summary {
  ~Summary() {
    if (lazy())
      fprintf(stderr, "cuda-emu[%d]: lazy streams: %ld operations queued, %zu at most on one stream\n", my_rank(),
              queued, max_queue);
    if (n_errors || n_warnings)
      fprintf(stderr, "cuda-emu[%d]: %d error(s), %d warning(s) reported (%ld kernel launches)\n", my_rank(), n_errors,
              n_warnings, launches);
  }
} summary;

// ---- lent to the other fakes (emu_bridge.h) ----
#include "emu_bridge.h"
void emu_count_cudnn(void) {
  if (counting) counts.cudnn++;
}
void emu_issue(cudaStream_t s, const char *name, std::function<void()> op) { issue(stream_of(s, name), name, std::move(op)); }
void emu_report_error(const char *msg) { emu_error("%s", msg); }
void emu_report_trace(const char *msg) { trace("%s", msg); }
bool emu_tracing(void) { return tracing(); }
void emu_check_device(const void *p, size_t bytes, const char *what) { check_dev_range(p, bytes, what); }
float emu_from_bf16(uint16_t h) { return from_bf16(h); }
uint16_t emu_to_bf16(float f) { return to_bf16(f); }
float emu_round_bf16(float f) { return round_bf16(f); }
