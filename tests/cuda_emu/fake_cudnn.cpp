// fake_cudnn.cpp — the subset of cuDNN's backend API that runtime/cuda/attn_cudnn.c calls, emulated
// on the CPU with the real header's signatures (a test tool, not production).
//
// Descriptors keep every attribute as it was set (type, count, values). Finalizing a tensor,
// operation or graph checks what the real library requires of it (dims, strides, a unique id, the
// operation's operands); heuristics offer one engine (global index 0) whose workspace is
// $EMU_CUDNN_WORKSPACE bytes (default 0). Executing a plan interprets its operation graph on
// the CPU in float, on the handle's stream: every tensor is read and written through its own dims
// and strides (bf16, fp32, int32, bool; by-value scalars from the variant pack's host pointers;
// virtual tensors held in float, rounded to bf16 where their type says), so the result is what the
// graph says — a wrong stride, scale, mask or head mapping shows in the numbers. Pointwise
// operations broadcast dims of 1; a matmul's batch dims and a reduction's output dims may also be
// a divisor of the other's (grouped: index i maps to i / (n / m), GQA's query head h to KV head
// h / group). cudnnGetVersion returns $EMU_CUDNN_VERSION (default this header's). EMU_TRACE=1
// prints each graph's operations and tensors when its plan is built.
#include <cudnn_graph.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "emu_bridge.h"

namespace {

struct Attr {
  cudnnBackendAttributeType_t type;
  int64_t n;
  std::vector<char> bytes;
};

size_t elem_size(cudnnBackendAttributeType_t t) {
  switch (t) {
  case CUDNN_TYPE_HANDLE: return sizeof(cudnnHandle_t);
  case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
  case CUDNN_TYPE_INT64: return 8;
  case CUDNN_TYPE_FLOAT: return 4;
  case CUDNN_TYPE_DOUBLE: return 8;
  case CUDNN_TYPE_VOID_PTR: return sizeof(void *);
  case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(void *);
  case CUDNN_TYPE_INT32: return 4;
  case CUDNN_TYPE_CHAR: return 1;
  default: return 4; // enums
  }
}

enum { DESC_MAGIC = 0x444e4e43 };

struct Desc {
  unsigned magic = DESC_MAGIC;
  cudnnBackendDescriptorType_t type;
  bool final = false;
  std::map<int, Attr> attrs;
  // execution plan: the graph's operations, in order; variant pack: ids, pointers, workspace
  std::vector<Desc *> ops;
  int64_t workspace = 0;
};

struct Handle {
  cudaStream_t stream = nullptr;
};

void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  emu_report_error(msg);
}

Desc *D(cudnnBackendDescriptor_t d) {
  Desc *x = (Desc *)d;
  if (!x || x->magic != DESC_MAGIC) return nullptr;
  return x;
}
const Attr *get(const Desc *d, int a) {
  auto it = d->attrs.find(a);
  return it == d->attrs.end() ? nullptr : &it->second;
}
template <class T> T one(const Desc *d, int a, T dflt) {
  const Attr *x = get(d, a);
  if (!x || x->n < 1) return dflt;
  T v;
  memcpy(&v, x->bytes.data(), sizeof v);
  return v;
}
std::vector<int64_t> ints(const Desc *d, int a) {
  const Attr *x = get(d, a);
  std::vector<int64_t> v;
  if (x && x->type == CUDNN_TYPE_INT64) v.assign((const int64_t *)x->bytes.data(), (const int64_t *)x->bytes.data() + x->n);
  return v;
}
Desc *desc(const Desc *d, int a) { return D(one<void *>(d, a, nullptr)); }

// ---- tensors at run time ----
struct Ten {
  const Desc *d;
  int64_t dim[4], str[4], uid;
  cudnnDataType_t type;
  bool virt, byval;
};
Ten ten_of(const Desc *t) {
  Ten x = {};
  x.d = t;
  std::vector<int64_t> dim = ints(t, CUDNN_ATTR_TENSOR_DIMENSIONS), str = ints(t, CUDNN_ATTR_TENSOR_STRIDES);
  for (int i = 0; i < 4; i++) x.dim[i] = dim[i], x.str[i] = str[i];
  x.uid = one<int64_t>(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, -1);
  x.type = one<cudnnDataType_t>(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT);
  x.virt = one<bool>(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, false);
  x.byval = one<bool>(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, false);
  return x;
}
int64_t span(const Ten &t) {
  int64_t s = 1;
  for (int i = 0; i < 4; i++) s += (t.dim[i] - 1) * t.str[i];
  return s;
}
size_t type_bytes(cudnnDataType_t t) {
  switch (t) {
  case CUDNN_DATA_BFLOAT16: case CUDNN_DATA_HALF: return 2;
  case CUDNN_DATA_BOOLEAN: return 1;
  case CUDNN_DATA_DOUBLE: case CUDNN_DATA_INT64: return 8;
  default: return 4;
  }
}
std::string ten_words(const Ten &t) {
  char b[256];
  snprintf(b, sizeof b, "id %lld %s%s type %d dims [%lld %lld %lld %lld] strides [%lld %lld %lld %lld]", (long long)t.uid,
           t.virt ? "virtual" : "", t.byval ? "by-value" : "", (int)t.type, (long long)t.dim[0], (long long)t.dim[1],
           (long long)t.dim[2], (long long)t.dim[3], (long long)t.str[0], (long long)t.str[1], (long long)t.str[2],
           (long long)t.str[3]);
  return b;
}

// Storage of one tensor during an execution: memory (non-virtual or by-value) or a float buffer.
struct Store {
  Ten t;
  void *mem = nullptr;                 // device or host (by-value) memory
  cudnnDataType_t mem_type;            // the type of mem's elements (a reshape keeps its source's)
  std::shared_ptr<std::vector<float>> buf; // virtual
  // a virtual tensor's float buffer is its dims row-major (virtual strides are layout hints the
  // library may ignore: cudnn-frontend gives some that overlap); memory goes by the strides
  int64_t compact(const int64_t i[4]) const { return ((i[0] * t.dim[1] + i[1]) * t.dim[2] + i[2]) * t.dim[3] + i[3]; }
  float at(const int64_t i[4]) const {
    if (buf) return (*buf)[(size_t)compact(i)];
    int64_t o = 0;
    for (int k = 0; k < 4; k++) o += i[k] * t.str[k];
    if (t.byval) o = 0;
    switch (mem_type) {
    case CUDNN_DATA_BFLOAT16: return emu_from_bf16(((const uint16_t *)mem)[o]);
    case CUDNN_DATA_FLOAT: return ((const float *)mem)[o];
    case CUDNN_DATA_INT32: return (float)((const int32_t *)mem)[o];
    case CUDNN_DATA_BOOLEAN: return ((const uint8_t *)mem)[o] ? 1.f : 0.f;
    default: fail("cudnn: tensor %s: data type %d is not emulated", ten_words(t).c_str(), (int)mem_type); return 0;
    }
  }
  void put(const int64_t i[4], float v) {
    if (t.type == CUDNN_DATA_BFLOAT16) v = emu_round_bf16(v);
    if (buf) {
      (*buf)[(size_t)compact(i)] = v;
      return;
    }
    int64_t o = 0;
    for (int k = 0; k < 4; k++) o += i[k] * t.str[k];
    switch (mem_type) {
    case CUDNN_DATA_BFLOAT16: ((uint16_t *)mem)[o] = emu_to_bf16(v); break;
    case CUDNN_DATA_FLOAT: ((float *)mem)[o] = v; break;
    default: fail("cudnn: writing tensor %s of data type %d is not emulated", ten_words(t).c_str(), (int)mem_type);
    }
  }
};

// Calls f(i) for every index of dims d.
template <class F> void each(const int64_t d[4], F f) {
  int64_t i[4];
  for (i[0] = 0; i[0] < d[0]; i[0]++)
    for (i[1] = 0; i[1] < d[1]; i[1]++)
      for (i[2] = 0; i[2] < d[2]; i[2]++)
        for (i[3] = 0; i[3] < d[3]; i[3]++) f(i);
}
// The index of an operand of dims from along one dim of the result's n: the same, 0 (broadcast),
// or grouped (n a multiple of m: i / (n / m)); -1 if the dims do not fit.
int64_t map_dim(int64_t i, int64_t n, int64_t m) {
  if (m == n) return i;
  if (m == 1) return 0;
  if (m > 0 && n % m == 0) return i / (n / m);
  return -1;
}
bool map_index(const int64_t i[4], const int64_t n[4], const int64_t m[4], int64_t out[4]) {
  for (int k = 0; k < 4; k++)
    if ((out[k] = map_dim(i[k], n[k], m[k])) < 0) return false;
  return true;
}

struct Exec {
  std::map<int64_t, void *> ptr; // the variant pack
  std::map<const Desc *, Store> st;
  const char *what = "cudnnBackendExecute";

  Store &in(const Desc *td) {
    auto it = st.find(td);
    if (it != st.end()) return it->second;
    Ten t = ten_of(td);
    if (t.virt) {
      fail("cudnn: virtual tensor %s is read before an operation writes it", ten_words(t).c_str());
      static Store none;
      return none;
    }
    return bind(td, t);
  }
  Store &bind(const Desc *td, const Ten &t) {
    Store s;
    s.t = t, s.mem_type = t.type;
    if (t.virt) s.buf = std::make_shared<std::vector<float>>((size_t)(t.dim[0] * t.dim[1] * t.dim[2] * t.dim[3]), NAN);
    else {
      auto p = ptr.find(t.uid);
      if (p == ptr.end() || !p->second) fail("cudnn: the variant pack has no pointer for tensor %s", ten_words(t).c_str());
      s.mem = p != ptr.end() ? p->second : nullptr;
      if (!t.byval && s.mem) emu_check_device(s.mem, (size_t)span(t) * type_bytes(t.type), "cudnnBackendExecute");
    }
    return st[td] = s;
  }
  Store &out(const Desc *td) {
    auto it = st.find(td);
    if (it != st.end()) return it->second;
    return bind(td, ten_of(td));
  }

  void pointwise(const Desc *op) {
    const Desc *pd = desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
    cudnnPointwiseMode_t mode = one<cudnnPointwiseMode_t>(pd, CUDNN_ATTR_POINTWISE_MODE, CUDNN_POINTWISE_IDENTITY);
    int64_t axis = one<int64_t>(pd, CUDNN_ATTR_POINTWISE_AXIS, -1);
    const Desc *xd = desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC), *bd = desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
    const Desc *td = desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC), *yd = desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
    Store &y = out(yd);
    const Store &x = in(xd);
    const Store *b = bd ? &in(bd) : nullptr, *t = td ? &in(td) : nullptr;
    each(y.t.dim, [&](const int64_t *i) {
      int64_t ix[4], ib[4], it[4];
      if (!map_index(i, y.t.dim, x.t.dim, ix) || (b && !map_index(i, y.t.dim, b->t.dim, ib)) ||
          (t && !map_index(i, y.t.dim, t->t.dim, it)))
        return fail("cudnn: pointwise mode %d: operand dims do not broadcast to %s", (int)mode, ten_words(y.t).c_str());
      float xv = x.at(ix), bv = b ? b->at(ib) : 0, v = 0;
      switch (mode) {
      case CUDNN_POINTWISE_ADD: v = xv + bv; break;
      case CUDNN_POINTWISE_SUB: v = xv - bv; break;
      case CUDNN_POINTWISE_MUL: v = xv * bv; break;
      case CUDNN_POINTWISE_DIV: v = xv / bv; break;
      case CUDNN_POINTWISE_EXP: v = expf(xv); break;
      case CUDNN_POINTWISE_LOG: v = logf(xv); break;
      case CUDNN_POINTWISE_IDENTITY: v = xv; break;
      case CUDNN_POINTWISE_CMP_GE: v = xv >= bv; break;
      case CUDNN_POINTWISE_BINARY_SELECT: v = t->at(it) != 0 ? xv : bv; break;
      case CUDNN_POINTWISE_GEN_INDEX:
        if (axis < 0 || axis > 3) return fail("cudnn: GEN_INDEX without an axis in 0..3");
        v = (float)i[axis];
        break;
      default: return fail("cudnn: pointwise mode %d is not emulated", (int)mode);
      }
      y.put(i, v);
    });
  }
  void matmul(const Desc *op) {
    const Store &a = in(desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC)), &b = in(desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC));
    Store &c = out(desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC));
    int64_t M = c.t.dim[2], N = c.t.dim[3], K = a.t.dim[3];
    if (a.t.dim[2] != M || b.t.dim[3] != N || b.t.dim[2] != K)
      return fail("cudnn: matmul shapes do not fit: A %s, B %s, C %s", ten_words(a.t).c_str(), ten_words(b.t).c_str(),
                  ten_words(c.t).c_str());
    // each operand's matrices gathered once (through their strides), then plain loops
    auto gather = [](const Store &x, int64_t r, int64_t cdim) {
      std::vector<float> v((size_t)(x.t.dim[0] * x.t.dim[1] * r * cdim));
      size_t f = 0;
      int64_t i[4];
      for (i[0] = 0; i[0] < x.t.dim[0]; i[0]++)
        for (i[1] = 0; i[1] < x.t.dim[1]; i[1]++)
          for (i[2] = 0; i[2] < r; i[2]++)
            for (i[3] = 0; i[3] < cdim; i[3]++) v[f++] = x.at(i);
      return v;
    };
    std::vector<float> av = gather(a, M, K), bv = gather(b, K, N);
    int64_t bd[4] = {c.t.dim[0], c.t.dim[1], 1, 1};
    std::vector<double> row((size_t)N);
    each(bd, [&](const int64_t *i) {
      int64_t ia[4], ib[4];
      int64_t adim[4] = {a.t.dim[0], a.t.dim[1], 1, 1}, bdim[4] = {b.t.dim[0], b.t.dim[1], 1, 1};
      if (!map_index(i, bd, adim, ia) || !map_index(i, bd, bdim, ib))
        return fail("cudnn: matmul batch dims do not map: A %s, B %s, C %s", ten_words(a.t).c_str(),
                    ten_words(b.t).c_str(), ten_words(c.t).c_str());
      const float *A = &av[(size_t)((ia[0] * a.t.dim[1] + ia[1]) * M * K)];
      const float *Bm = &bv[(size_t)((ib[0] * b.t.dim[1] + ib[1]) * K * N)];
      for (int64_t m = 0; m < M; m++) {
        std::fill(row.begin(), row.end(), 0.0);
        for (int64_t k = 0; k < K; k++) {
          double x = A[m * K + k];
          const float *br = Bm + k * N;
          for (int64_t n = 0; n < N; n++) row[(size_t)n] += x * br[n];
        }
        for (int64_t n = 0; n < N; n++) {
          int64_t xc[4] = {i[0], i[1], m, n};
          c.put(xc, (float)row[(size_t)n]);
        }
      }
    });
  }
  void reduction(const Desc *op) {
    const Desc *rd = desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
    cudnnReduceTensorOp_t mode = one<cudnnReduceTensorOp_t>(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_REDUCE_TENSOR_ADD);
    if (mode != CUDNN_REDUCE_TENSOR_ADD && mode != CUDNN_REDUCE_TENSOR_MAX)
      return fail("cudnn: reduction mode %d is not emulated", (int)mode);
    const Store &x = in(desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC));
    Store &y = out(desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC));
    int64_t n = 1;
    for (int k = 0; k < 4; k++) n *= y.t.dim[k];
    std::vector<double> acc((size_t)n, mode == CUDNN_REDUCE_TENSOR_MAX ? -INFINITY : 0.0);
    each(x.t.dim, [&](const int64_t *i) {
      int64_t o[4];
      for (int k = 0; k < 4; k++) {
        int64_t m = y.t.dim[k], N = x.t.dim[k];
        o[k] = m == N ? i[k] : m == 1 ? 0 : m > 0 && N % m == 0 ? i[k] / (N / m) : -1;
        if (o[k] < 0) return fail("cudnn: reduction of %s into %s", ten_words(x.t).c_str(), ten_words(y.t).c_str());
      }
      size_t f = (size_t)(((o[0] * y.t.dim[1] + o[1]) * y.t.dim[2] + o[2]) * y.t.dim[3] + o[3]);
      double v = x.at(i);
      acc[f] = mode == CUDNN_REDUCE_TENSOR_MAX ? (v > acc[f] ? v : acc[f]) : acc[f] + v;
    });
    each(y.t.dim, [&](const int64_t *i) {
      size_t f = (size_t)(((i[0] * y.t.dim[1] + i[1]) * y.t.dim[2] + i[2]) * y.t.dim[3] + i[3]);
      y.put(i, (float)acc[f]);
    });
  }
  // y: x's memory seen through y's dims and strides (a non-virtual x's device memory as it is; a
  // virtual x laid out by its declared strides, which must nest, and copied, rounded when y is bf16)
  void reshape(const Desc *op) {
    const Desc *xd = desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC), *yd = desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
    const Store &x = in(xd);
    Ten yt = ten_of(yd);
    if (!yt.virt) return fail("cudnn: reshape into non-virtual %s is not emulated", ten_words(yt).c_str());
    Store y;
    y.t = yt;
    if (!x.buf) {
      if (span(yt) > span(x.t))
        return fail("cudnn: reshape of %s into %s reads past its elements", ten_words(x.t).c_str(), ten_words(yt).c_str());
      y.mem = x.mem, y.mem_type = x.mem_type;
      st[yd] = y;
      return;
    }
    int ord[4] = {0, 1, 2, 3}; // x's dims by stride, largest first
    std::sort(ord, ord + 4, [&](int a, int b) { return x.t.str[a] > x.t.str[b]; });
    y.buf = std::make_shared<std::vector<float>>((size_t)(yt.dim[0] * yt.dim[1] * yt.dim[2] * yt.dim[3]), NAN);
    each(yt.dim, [&](const int64_t *i) {
      int64_t off = 0, xi[4];
      for (int k = 0; k < 4; k++) off += i[k] * yt.str[k];
      for (int k = 0; k < 4; k++) {
        int d = ord[k];
        xi[d] = x.t.str[d] > 0 ? off / x.t.str[d] : 0;
        if (xi[d] >= x.t.dim[d]) return fail("cudnn: reshape of %s into %s: strides that do not nest", ten_words(x.t).c_str(), ten_words(yt).c_str());
        off -= xi[d] * x.t.str[d];
      }
      y.put(i, x.at(xi));
    });
    st[yd] = y;
  }
  void run(const std::vector<Desc *> &ops) {
    for (Desc *op : ops) {
      switch (op->type) {
      case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: pointwise(op); break;
      case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: matmul(op); break;
      case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: reduction(op); break;
      case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: reshape(op); break;
      default: fail("cudnn: operation type %d is not emulated", (int)op->type);
      }
    }
  }
};

// What finalizing d requires; returns the failure, or nullptr.
const char *check_final(Desc *d) {
  auto need = [&](int a) { return get(d, a) != nullptr; };
  auto need_final = [&](int a) {
    Desc *x = desc(d, a);
    return x && x->final;
  };
  switch (d->type) {
  case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
    if (!need(CUDNN_ATTR_TENSOR_DATA_TYPE) || !need(CUDNN_ATTR_TENSOR_UNIQUE_ID)) return "a tensor needs a type and an id";
    if (ints(d, CUDNN_ATTR_TENSOR_DIMENSIONS).size() != 4 || ints(d, CUDNN_ATTR_TENSOR_STRIDES).size() != 4)
      return "the emulated tensors have 4 dims and 4 strides";
    for (int64_t v : ints(d, CUDNN_ATTR_TENSOR_DIMENSIONS))
      if (v < 1) return "a tensor dim is < 1";
    return nullptr;
  }
  case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    return need_final(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR) && need_final(CUDNN_ATTR_OPERATION_POINTWISE_XDESC) &&
                   need_final(CUDNN_ATTR_OPERATION_POINTWISE_YDESC)
               ? nullptr
               : "a pointwise operation needs a finalized mode, x and y";
  case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
    return need_final(CUDNN_ATTR_OPERATION_MATMUL_ADESC) && need_final(CUDNN_ATTR_OPERATION_MATMUL_BDESC) &&
                   need_final(CUDNN_ATTR_OPERATION_MATMUL_CDESC) && need_final(CUDNN_ATTR_OPERATION_MATMUL_DESC)
               ? nullptr
               : "a matmul needs finalized a, b, c and a matmul descriptor";
  case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
    return need_final(CUDNN_ATTR_OPERATION_REDUCTION_XDESC) && need_final(CUDNN_ATTR_OPERATION_REDUCTION_YDESC) &&
                   need_final(CUDNN_ATTR_OPERATION_REDUCTION_DESC)
               ? nullptr
               : "a reduction needs finalized x, y and a reduction descriptor";
  case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
    return need_final(CUDNN_ATTR_OPERATION_RESHAPE_XDESC) && need_final(CUDNN_ATTR_OPERATION_RESHAPE_YDESC)
               ? nullptr
               : "a reshape needs finalized x and y";
  case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: {
    const Attr *a = get(d, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    if (!a || a->n < 1) return "an operation graph needs operations";
    if (!need(CUDNN_ATTR_OPERATIONGRAPH_HANDLE)) return "an operation graph needs a handle";
    for (int64_t i = 0; i < a->n; i++) {
      Desc *op = D(((void *const *)a->bytes.data())[i]);
      if (!op || !op->final) return "an operation of the graph is not finalized";
    }
    return nullptr;
  }
  case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
    return need_final(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH) && need(CUDNN_ATTR_ENGINEHEUR_MODE)
               ? nullptr
               : "heuristics need a finalized graph and a mode";
  case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
    Desc *cfg = desc(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
    if (!cfg || !cfg->final || !need(CUDNN_ATTR_EXECUTION_PLAN_HANDLE)) return "a plan needs a handle and an engine configuration";
    Desc *g = cfg->ops.empty() ? nullptr : cfg->ops[0];
    const Attr *a = g ? get(g, CUDNN_ATTR_OPERATIONGRAPH_OPS) : nullptr;
    if (!a) return "the engine configuration has no graph";
    d->ops.clear();
    for (int64_t i = 0; i < a->n; i++) d->ops.push_back(D(((void *const *)a->bytes.data())[i]));
    d->workspace = cfg->workspace;
    if (emu_tracing()) {
      char line[400];
      for (Desc *op : d->ops) {
        std::string s;
        for (auto &kv : op->attrs)
          if (kv.second.type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
            Desc *t = D(*(void *const *)kv.second.bytes.data());
            if (t && t->type == CUDNN_BACKEND_TENSOR_DESCRIPTOR) s += " [" + ten_words(ten_of(t)) + "]";
          }
        snprintf(line, sizeof line, "cudnn plan: operation type %d:%.300s", (int)op->type, s.c_str());
        emu_report_trace(line);
      }
    }
    return nullptr;
  }
  default: return nullptr;
  }
}

} // namespace

struct cudnnContext {
  Handle h;
};

extern "C" {

size_t cudnnGetVersion(void) {
  const char *e = getenv("EMU_CUDNN_VERSION");
  return e && *e ? (size_t)atol(e) : (size_t)CUDNN_VERSION;
}
const char *cudnnGetErrorString(cudnnStatus_t s) {
  switch (s) {
  case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
  case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED (cuda-emu)";
  case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM (cuda-emu)";
  default: return "a cuDNN error (cuda-emu)";
  }
}
cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
  *h = new cudnnContext();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t h) {
  delete h;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
  h->h.stream = s;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t t, cudnnBackendDescriptor_t *d) {
  Desc *x = new Desc();
  x->type = t;
  *d = x;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
  Desc *x = D(d);
  if (!x) return CUDNN_STATUS_BAD_PARAM;
  x->magic = 0;
  delete x;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                                       cudnnBackendAttributeType_t t, int64_t n, const void *v) {
  Desc *x = D(d);
  if (!x || n < 0 || (n && !v)) return CUDNN_STATUS_BAD_PARAM;
  if (x->final) return CUDNN_STATUS_NOT_SUPPORTED; // the real library refuses changes after finalizing
  Attr at;
  at.type = t, at.n = n;
  at.bytes.assign((const char *)v, (const char *)v + (size_t)n * elem_size(t));
  x->attrs[a] = at;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t d) {
  Desc *x = D(d);
  if (!x) return CUDNN_STATUS_BAD_PARAM;
  if (const char *why = check_final(x)) {
    char msg[300];
    snprintf(msg, sizeof msg, "cudnn: cudnnBackendFinalize (descriptor type %d): %s", (int)x->type, why);
    emu_report_trace(msg);
    return CUDNN_STATUS_BAD_PARAM;
  }
  x->final = true;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const d, cudnnBackendAttributeName_t a,
                                       cudnnBackendAttributeType_t t, int64_t req, int64_t *n, void *v) {
  Desc *x = D(d);
  if (!x || !x->final) return CUDNN_STATUS_BAD_PARAM;
  if (x->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && a == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
    *n = 1; // one engine
    if (req >= 1 && v) {
      Desc *cfg = D(((void **)v)[0]);
      if (!cfg || cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
      cfg->ops.assign(1, desc(x, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH));
      const char *w = getenv("EMU_CUDNN_WORKSPACE");
      cfg->workspace = w && *w ? atoll(w) : 0;
      cfg->final = true;
    }
    return CUDNN_STATUS_SUCCESS;
  }
  if (x->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && a == CUDNN_ATTR_ENGINECFG_ENGINE) {
    Desc *e = D(*(void **)v);
    if (!e || e->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR) return CUDNN_STATUS_BAD_PARAM;
    int64_t idx = 0;
    e->attrs[CUDNN_ATTR_ENGINE_GLOBAL_INDEX] = Attr{CUDNN_TYPE_INT64, 1, std::vector<char>((char *)&idx, (char *)&idx + 8)};
    e->final = true, *n = 1;
    return CUDNN_STATUS_SUCCESS;
  }
  if (x->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR && a == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
    *n = 1, *(int64_t *)v = x->workspace;
    return CUDNN_STATUS_SUCCESS;
  }
  const Attr *at = get(x, a);
  if (!at || at->type != t) return CUDNN_STATUS_NOT_SUPPORTED;
  *n = at->n;
  if (v) memcpy(v, at->bytes.data(), (size_t)(req < at->n ? req : at->n) * elem_size(t));
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
  Desc *p = D(plan), *vp = D(pack);
  if (!h || !p || !vp || !p->final || !vp->final || p->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
    return CUDNN_STATUS_BAD_PARAM;
  std::vector<int64_t> uids = ints(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  const Attr *ptrs = get(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  if (!ptrs || (size_t)ptrs->n != uids.size()) return CUDNN_STATUS_BAD_PARAM;
  void *ws = one<void *>(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, nullptr);
  if (p->workspace > 0) {
    if (!ws) return CUDNN_STATUS_BAD_PARAM;
    emu_check_device(ws, (size_t)p->workspace, "cudnnBackendExecute's workspace");
  }
  auto ex = std::make_shared<Exec>();
  // by-value scalars are read now (host values the caller may reuse); the rest at run time
  std::vector<Desc *> ops = p->ops;
  for (size_t i = 0; i < uids.size(); i++) ex->ptr[uids[i]] = ((void *const *)ptrs->bytes.data())[i];
  std::vector<std::shared_ptr<std::vector<char>>> keep;
  for (Desc *op : ops)
    for (auto &kv : op->attrs)
      if (kv.second.type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
        Desc *t = D(*(void *const *)kv.second.bytes.data());
        if (!t || t->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR) continue;
        Ten tt = ten_of(t);
        if (!tt.byval) continue;
        auto it = ex->ptr.find(tt.uid);
        if (it == ex->ptr.end() || !it->second) continue; // reported when read
        auto copy = std::make_shared<std::vector<char>>((char *)it->second, (char *)it->second + type_bytes(tt.type));
        keep.push_back(copy), it->second = copy->data();
      }
  emu_count_cudnn();
  emu_issue(h->h.stream, "cudnnBackendExecute", [ex, ops, keep] { ex->run(ops); });
  return CUDNN_STATUS_SUCCESS;
}

} // extern "C"
