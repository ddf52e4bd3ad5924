// ==== templates/kernels/80-flash.cu: flash attention on tensor cores ====

// ---- tiled causal GQA flash attention on tensor cores (FlashAttention-2, Dao 2023) ----------
// The same layouts and results as attention_forward / attention_backward_{dq,dkv} above, tiled:
// a block of FLASH_WARPS warps owns FLASH_BQ rows (16 per warp) and walks the tiles of the other
// side through shared memory (bf16, whatever `act` is); the products Q·Kᵀ, P·V, dO·Vᵀ, dS·K,
// Pᵀ·dO, dSᵀ·Q are bf16 16x16x16 wmma fragments with fp32 accumulation; softmax, masking and
// the log-sum-exp are fp32, per warp through shared memory (the fragments' element layout is
// unspecified, so it is never assumed: the rows of accumulator elements are read off a fragment
// loaded from a matrix of row numbers, acc_rows). P and dS are rounded to bf16 for their products,
// as in FlashAttention.
// One description for both layouts of 45-context.cu: the queries are a rank's SEQ_LEN tokens of
// each sequence in two chunks of SEQ_LEN / 2 at positions lo.. and hi.. (span_pos), the keys and
// values the whole sequence's CP_SEQ_LEN tokens; the query at position p sees keys 0..p. Without
// context parallelism lo = 0, hi = SEQ_LEN / 2, CP_SEQ_LEN = SEQ_LEN: the plain causal attention.
// Tiles entirely after a row block's last position are never visited, the others are masked
// elementwise at each row's own position (a tile of 64 queries may straddle the two chunks when
// SEQ_LEN / 2 is no multiple of 64; span_pos is non-decreasing in t since hi >= lo + SEQ_LEN / 2).
//   forward:  out, lse (overwritten)            flash_attention_forward
//   backward: delta = rowsum(dout · out)        flash_attention_backward_prep
//             dq = scale · dS K                 flash_attention_backward_dq  (query tiles)
//             dk = scale · dSᵀ Q, dv = Pᵀ dO    flash_attention_backward_dkv (key tiles, all GROUP heads)
//   (dq, dk, dv written when add is 0: mtrt_ops.h's rt_attention_backward; added to when add is 1:
//   rt_attention_span_backward)
//   with P = exp(scale · Q Kᵀ − lse), dS = P ⊙ (dO Vᵀ − delta).
// All shared memory is static (< 48 KB; launch with 0 dynamic bytes). Needs sm_80+ (bf16 wmma).
// The kernels exist where HAVE_FLASH_ATTENTION is defined: head_dim a multiple of 16 up to 128,
// the value head size equal to it (not MLA's), seq_len (a rank's) a multiple of FLASH_BQ, so that
// each chunk of SEQ_LEN / 2 is a whole number of the backward's FLASH_BB steps; elsewhere (or when
// a name lookup fails) the host keeps the warp-per-row kernels of 40-attention.cu and 45-context.cu.
#define FLASH_BQ 64    // rows per block: queries (forward, dq) or keys (dkv); 16 per warp
#define FLASH_BK 64    // keys per step of the forward loop
#define FLASH_BB 32    // per step of the backward loops: keys (dq) or queries (dkv); one per lane
#define FLASH_WARPS (FLASH_BQ / 16)
#define FLASH_THREADS (32 * FLASH_WARPS) // 128: the block of every flash kernel
#if HEAD_DIM % 16 == 0 && HEAD_DIM <= 128 && V_DIM == HEAD_DIM && SEQ_LEN % FLASH_BQ == 0 && \
    (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
#define HAVE_FLASH_ATTENTION 1
#include <mma.h>
using namespace nvcuda;

#define FLASH_LD (HEAD_DIM + 8) // bf16 row pitch of Q, K, V, dO tiles (padded against bank conflicts)
#define FLASH_SLD (FLASH_BK + 4) // fp32 row pitch of the forward's per-warp score scratch (16 x FLASH_BK)
#define FLASH_PLD (FLASH_BK + 8) // bf16 row pitch of the forward's per-warp P (16 x FLASH_BK)
#define FLASH_BSLD (FLASH_BB + 4) // fp32 row pitch of the backward's per-warp scratch (16 x FLASH_BB)
#define FLASH_BPLD (FLASH_BB + 8) // bf16 row pitch of the backward's per-warp P, dS (16 x FLASH_BB)
#define FLASH_BATCH (TOKENS / SEQ_LEN)
// launch configurations (grid x, y, z; block FLASH_THREADS; static shared memory in bytes)
#define FLASH_FWD_GRID SEQ_LEN / FLASH_BQ, HEADS, FLASH_BATCH
#define FLASH_FWD_SMEM (FLASH_BK * FLASH_LD * 2 + FLASH_WARPS * 16 * (FLASH_SLD * 4 + FLASH_PLD * 2 + 4))
#define FLASH_PREP_THREADS 128 // one warp per (token, head)
#define FLASH_PREP_BLOCKS (TOKENS * HEADS / (FLASH_PREP_THREADS / 32))
#define FLASH_DQ_GRID SEQ_LEN / FLASH_BQ, HEADS, FLASH_BATCH
#define FLASH_DQ_SMEM (2 * FLASH_BB * FLASH_LD * 2 + FLASH_WARPS * 16 * (FLASH_BSLD * 4 + FLASH_BPLD * 2 + 12))
#define FLASH_DKV_GRID CP_SEQ_LEN / FLASH_BQ, KV_HEADS, FLASH_BATCH // at most: the host launches the key tiles
                                                                 // up to the last position, ceil((hi + SEQ_LEN / 2) / 64)
#define FLASH_DKV_SMEM \
  (2 * FLASH_BB * FLASH_LD * 2 + FLASH_WARPS * 16 * (FLASH_BSLD * 4 + 2 * FLASH_BPLD * 2) + 8 * FLASH_BB)
static_assert(FLASH_BQ == 2 * FLASH_BB && FLASH_BK == FLASH_BQ && FLASH_BB == 32, "flash tiles");
static_assert(HEADS % KV_HEADS == 0, "query heads must be a multiple of kv heads");
static_assert(FLASH_FWD_SMEM <= 48 * 1024 && FLASH_DQ_SMEM <= 48 * 1024 && FLASH_DKV_SMEM <= 48 * 1024,
              "flash attention shared memory");

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> FragA; // A (m, k) row-major
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> FragB; // B (k, n) row-major
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> FragBt; // B = Xᵀ, X (n, k) row-major
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> Acc;
#define ACC_N Acc::num_elements

// rows × HEAD_DIM values (row r at src + r·stride) to bf16 shared memory of pitch FLASH_LD.
__device__ __forceinline__ void flash_load(bf16 *dst, const act *src, size_t stride, int rows) {
  for (int i = threadIdx.x; i < rows * (HEAD_DIM / VEC); i += blockDim.x) {
    int r = i / (HEAD_DIM / VEC), c = i % (HEAD_DIM / VEC) * VEC;
    Vec a;
    a.u = *(const uint4 *)(src + r * stride + c);
#pragma unroll
    for (int j = 0; j < VEC; j++) dst[r * FLASH_LD + c + j] = __float2bfloat16(f32(a.h[j]));
  }
}

// rows[i]: the row (0..15) of element i of an accumulator fragment, read off a fragment loaded
// from a matrix whose entries are their row numbers; scratch: 16 x ld floats of this warp.
__device__ __forceinline__ void acc_rows(int *rows, float *scratch, int ld) {
  for (int i = threadIdx.x % 32; i < 256; i += 32) scratch[i / 16 * ld + i % 16] = (float)(i / 16);
  __syncwarp();
  Acc f;
  wmma::load_matrix_sync(f, scratch, ld, wmma::mem_row_major);
#pragma unroll
  for (int i = 0; i < ACC_N; i++) rows[i] = (int)f.x[i];
  __syncwarp();
}

// dst (16 rows of pitch dst_ld) = (add: +=) the warp's 16 x (16·NF) accumulators a[0..NF),
// through scratch (16 x ld floats, ld >= 16·per), per fragments at a time.
template <int NF, int per, bool add>
__device__ __forceinline__ void flash_write(act *dst, size_t dst_ld, Acc *a, float *scratch, int ld) {
  int lane = threadIdx.x % 32;
#pragma unroll
  for (int g = 0; g < NF; g += per) {
#pragma unroll
    for (int f = g; f < g + per && f < NF; f++)
      wmma::store_matrix_sync(scratch + (f - g) * 16, a[f], ld, wmma::mem_row_major);
    __syncwarp();
    int nc = 16 * (NF - g < per ? NF - g : per);
    for (int i = lane; i < 16 * nc; i += 32) {
      act *p = dst + (i / nc) * dst_ld + g * 16 + i % nc;
      *p = to_act((add ? f32(*p) : 0.f) + scratch[i / nc * ld + i % nc]);
    }
    __syncwarp();
  }
}

// out, lse: grid (SEQ_LEN / FLASH_BQ, HEADS, TOKENS / SEQ_LEN) = FLASH_FWD_GRID, block
// FLASH_THREADS, static shared memory FLASH_FWD_SMEM bytes. Block (x, h, b): the queries of tile
// qt (the last first: the longest rows start first) of head h in sequence b; warp w its rows
// 16w..16w+15, Q in registers, O in fp32 accumulators, the running max m and sum l per row held
// by the lane pair that owns the row in the softmax (row lane / 2, columns half (lane % 2)).
// q, k, v rows qld, kld, vld values apart; the chunks at positions lo, hi (span_pos).
extern "C" __global__ void __launch_bounds__(FLASH_THREADS)
    flash_attention_forward(act *out, float *lse, const act *q, const act *k, const act *v, int qld, int kld,
                            int vld, long long lo, long long hi) {
  __shared__ __align__(128) bf16 kv[FLASH_BK * FLASH_LD]; // the Q tile, then K and V of each step
  __shared__ __align__(128) float scr[FLASH_WARPS][16 * FLASH_SLD]; // scores S (16, FLASH_BK)
  __shared__ __align__(128) bf16 pb[FLASH_WARPS][16 * FLASH_PLD];   // probabilities P (16, FLASH_BK)
  __shared__ float rowv[FLASH_WARPS][16];                           // per row: rescale, then 1 / l
  int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, kvh = h / GROUP, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  int q0 = qt * FLASH_BQ, r = lane / 2, half = lane % 2, t = q0 + 16 * w + r; // t: this lane's query
  int pos = (int)span_pos(t, lo, hi), last = (int)span_pos(q0 + FLASH_BQ - 1, lo, hi); // its position; the tile's last
  size_t tok0 = (size_t)blockIdx.z * SEQ_LEN, key0 = (size_t)blockIdx.z * CP_SEQ_LEN; // the sequence's first query, key
  const float scale = rsqrtf((float)HEAD_DIM);
  float *S = scr[w], *rv = rowv[w];
  bf16 *P = pb[w];
  int rows[ACC_N];
  acc_rows(rows, S, FLASH_SLD);
  flash_load(kv, q + (tok0 + q0) * qld + h * HEAD_DIM, qld, FLASH_BQ);
  __syncthreads();
  FragA qf[HEAD_DIM / 16];
  Acc o[HEAD_DIM / 16];
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++) {
    wmma::load_matrix_sync(qf[d], kv + 16 * w * FLASH_LD + 16 * d, FLASH_LD);
    wmma::fill_fragment(o[d], 0.f);
  }
  float m = NEG_INF, l = 0;
  for (int k0 = 0; k0 <= last; k0 += FLASH_BK) {
    __syncthreads(); // every warp is done with kv (Q, or V of the last step)
    flash_load(kv, k + (key0 + k0) * kld + kvh * HEAD_DIM, kld, FLASH_BK);
    __syncthreads();
    // S (16, FLASH_BK) = Q_w Kᵀ
#pragma unroll
    for (int n = 0; n < FLASH_BK / 16; n++) {
      Acc s;
      wmma::fill_fragment(s, 0.f);
#pragma unroll
      for (int d = 0; d < HEAD_DIM / 16; d++) {
        FragBt kb;
        wmma::load_matrix_sync(kb, kv + 16 * n * FLASH_LD + 16 * d, FLASH_LD);
        wmma::mma_sync(s, qf[d], kb, s);
      }
      wmma::store_matrix_sync(S + 16 * n, s, FLASH_SLD, wmma::mem_row_major);
    }
    __syncwarp();
    // online softmax of row r over keys j0..j0 + FLASH_BK / 2 - 1 (masked: j > pos)
    const float *sr = S + r * FLASH_SLD + half * (FLASH_BK / 2);
    int j0 = k0 + half * (FLASH_BK / 2);
    float mx = NEG_INF, sum = 0;
    for (int c = 0; c < FLASH_BK / 2; c++)
      if (j0 + c <= pos) mx = fmaxf(mx, sr[c]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    // mn is finite from the first step on (key 0 <= pos is in it), where corr = exp(-inf) = 0; a
    // later step with every key after pos keeps m (corr 1, p 0)
    float mn = fmaxf(m, scale * mx), corr = __expf(m - mn);
    for (int c = 0; c < FLASH_BK / 2; c++) {
      float p = j0 + c <= pos ? __expf(scale * sr[c] - mn) : 0.f;
      sum += p;
      P[r * FLASH_PLD + half * (FLASH_BK / 2) + c] = __float2bfloat16(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum, m = mn;
    if (half == 0) rv[r] = corr;
    __syncwarp();
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 16; d++)
#pragma unroll
      for (int i = 0; i < ACC_N; i++) o[d].x[i] *= rv[rows[i]];
    __syncthreads(); // every warp is done with K
    flash_load(kv, v + (key0 + k0) * vld + kvh * HEAD_DIM, vld, FLASH_BK);
    __syncthreads();
    // O += P V
    FragA pf[FLASH_BK / 16];
#pragma unroll
    for (int c = 0; c < FLASH_BK / 16; c++) wmma::load_matrix_sync(pf[c], P + 16 * c, FLASH_PLD);
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 16; d++)
#pragma unroll
      for (int c = 0; c < FLASH_BK / 16; c++) {
        FragB vb;
        wmma::load_matrix_sync(vb, kv + 16 * c * FLASH_LD + 16 * d, FLASH_LD);
        wmma::mma_sync(o[d], pf[c], vb, o[d]);
      }
  }
  if (half == 0) rv[r] = 1.f / l, lse[(tok0 + t) * HEADS + h] = m + __logf(l);
  __syncwarp();
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++)
#pragma unroll
    for (int i = 0; i < ACC_N; i++) o[d].x[i] *= rv[rows[i]];
  flash_write<HEAD_DIM / 16, FLASH_BK / 16, false>(out + ((tok0 + q0 + 16 * w) * HEADS + h) * HEAD_DIM,
                                                   HEADS * HEAD_DIM, o, S, FLASH_SLD);
}

// delta (TOKENS, HEADS) = Σ_d dout · out: grid FLASH_PREP_BLOCKS = TOKENS · HEADS / 4, block
// FLASH_PREP_THREADS; one warp per (token, head).
extern "C" __global__ void flash_attention_backward_prep(float *delta, const act *dout, const act *out) {
  int w = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (w >= TOKENS * HEADS) return;
  const act *a = dout + (size_t)w * HEAD_DIM, *b = out + (size_t)w * HEAD_DIM;
  float s = 0;
  for (int i = lane; i < HEAD_DIM; i += 32) s += f32(a[i]) * f32(b[i]);
  s = warp_sum(s);
  if (lane == 0) delta[w] = s;
}

// dq = scale · dS K: grid (SEQ_LEN / FLASH_BQ, HEADS, TOKENS / SEQ_LEN) = FLASH_DQ_GRID, block
// FLASH_THREADS, static shared memory FLASH_DQ_SMEM bytes. Block (x, h, b): the queries of tile
// qt (the last first) of head h in sequence b, over the key steps of FLASH_BB keys up to the
// tile's last position; warp w its rows 16w..16w+15 (Q, dO in registers, dQ in fp32
// accumulators); in the elementwise passes lane = key column, looping over the warp's 16 rows.
// Layouts, lo and hi as flash_attention_forward's; dq written (add 0) or added to (add 1).
extern "C" __global__ void __launch_bounds__(FLASH_THREADS)
    flash_attention_backward_dq(act *dq, const act *dout, const act *q, const act *k, const act *v, const float *lse,
                                const float *delta, int qld, int kld, int vld, long long lo, long long hi, int add) {
  __shared__ __align__(128) bf16 kvs[2 * FLASH_BB * FLASH_LD]; // the Q, then dO tile; then K and V of each step
  __shared__ __align__(128) float scr[FLASH_WARPS][16 * FLASH_BSLD]; // S, then dP (16, FLASH_BB)
  __shared__ __align__(128) bf16 dsb[FLASH_WARPS][16 * FLASH_BPLD];  // scale · dS (16, FLASH_BB)
  __shared__ float rowl[FLASH_WARPS][16], rowd[FLASH_WARPS][16];     // lse, delta of the warp's rows
  __shared__ int rowp[FLASH_WARPS][16];                              // their positions
  int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, kvh = h / GROUP, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  int q0 = qt * FLASH_BQ, tw = q0 + 16 * w; // tw: the warp's first query
  int last = (int)span_pos(q0 + FLASH_BQ - 1, lo, hi), wlast = (int)span_pos(tw + 15, lo, hi); // block's, warp's last position
  size_t tok0 = (size_t)blockIdx.z * SEQ_LEN, key0 = (size_t)blockIdx.z * CP_SEQ_LEN;
  const float scale = rsqrtf((float)HEAD_DIM);
  bf16 *ks = kvs, *vs = kvs + FLASH_BB * FLASH_LD, *DS = dsb[w];
  float *S = scr[w];
  if (lane < 16) {
    rowl[w][lane] = lse[(tok0 + tw + lane) * HEADS + h];
    rowd[w][lane] = delta[(tok0 + tw + lane) * HEADS + h];
    rowp[w][lane] = (int)span_pos(tw + lane, lo, hi);
  }
  FragA qf[HEAD_DIM / 16], of[HEAD_DIM / 16];
  Acc acc[HEAD_DIM / 16];
  flash_load(kvs, q + (tok0 + q0) * qld + h * HEAD_DIM, qld, FLASH_BQ);
  __syncthreads();
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++) wmma::load_matrix_sync(qf[d], kvs + 16 * w * FLASH_LD + 16 * d, FLASH_LD);
  __syncthreads();
  flash_load(kvs, dout + ((tok0 + q0) * HEADS + h) * HEAD_DIM, HEADS * HEAD_DIM, FLASH_BQ);
  __syncthreads();
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++) {
    wmma::load_matrix_sync(of[d], kvs + 16 * w * FLASH_LD + 16 * d, FLASH_LD);
    wmma::fill_fragment(acc[d], 0.f);
  }
  for (int k0 = 0; k0 <= last; k0 += FLASH_BB) {
    __syncthreads(); // every warp is done with kvs
    flash_load(ks, k + (key0 + k0) * kld + kvh * HEAD_DIM, kld, FLASH_BB);
    flash_load(vs, v + (key0 + k0) * vld + kvh * HEAD_DIM, vld, FLASH_BB);
    __syncthreads();
    if (k0 > wlast) continue; // every key of the step is after the warp's queries
    // S (16, FLASH_BB) = Q_w Kᵀ, then P = exp(scale · S − lse) of column j = k0 + lane
#pragma unroll
    for (int n = 0; n < FLASH_BB / 16; n++) {
      Acc s;
      wmma::fill_fragment(s, 0.f);
#pragma unroll
      for (int d = 0; d < HEAD_DIM / 16; d++) {
        FragBt kb;
        wmma::load_matrix_sync(kb, ks + 16 * n * FLASH_LD + 16 * d, FLASH_LD);
        wmma::mma_sync(s, qf[d], kb, s);
      }
      wmma::store_matrix_sync(S + 16 * n, s, FLASH_BSLD, wmma::mem_row_major);
    }
    __syncwarp();
    int j = k0 + lane;
    float p[16];
#pragma unroll
    for (int r = 0; r < 16; r++) p[r] = j <= rowp[w][r] ? __expf(scale * S[r * FLASH_BSLD + lane] - rowl[w][r]) : 0.f;
    __syncwarp();
    // dP (16, FLASH_BB) = dO_w Vᵀ, then scale · dS = scale · P (dP − delta)
#pragma unroll
    for (int n = 0; n < FLASH_BB / 16; n++) {
      Acc s;
      wmma::fill_fragment(s, 0.f);
#pragma unroll
      for (int d = 0; d < HEAD_DIM / 16; d++) {
        FragBt vb;
        wmma::load_matrix_sync(vb, vs + 16 * n * FLASH_LD + 16 * d, FLASH_LD);
        wmma::mma_sync(s, of[d], vb, s);
      }
      wmma::store_matrix_sync(S + 16 * n, s, FLASH_BSLD, wmma::mem_row_major);
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; r++)
      DS[r * FLASH_BPLD + lane] = __float2bfloat16(scale * p[r] * (S[r * FLASH_BSLD + lane] - rowd[w][r]));
    __syncwarp();
    // dQ_w += (scale · dS) K
    FragA df[FLASH_BB / 16];
#pragma unroll
    for (int c = 0; c < FLASH_BB / 16; c++) wmma::load_matrix_sync(df[c], DS + 16 * c, FLASH_BPLD);
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 16; d++)
#pragma unroll
      for (int c = 0; c < FLASH_BB / 16; c++) {
        FragB kb;
        wmma::load_matrix_sync(kb, ks + 16 * c * FLASH_LD + 16 * d, FLASH_LD);
        wmma::mma_sync(acc[d], df[c], kb, acc[d]);
      }
  }
  act *dst = dq + (tok0 + tw) * qld + h * HEAD_DIM;
  if (add) flash_write<HEAD_DIM / 16, FLASH_BB / 16, true>(dst, qld, acc, S, FLASH_BSLD);
  else flash_write<HEAD_DIM / 16, FLASH_BB / 16, false>(dst, qld, acc, S, FLASH_BSLD);
}

// dk = scale · dSᵀ Q, dv = Pᵀ dO (B, CP_SEQ_LEN, ...: the whole sequences' keys; written when add is
// 0, added to when 1): grid (ceil((hi + SEQ_LEN / 2) / FLASH_BQ), KV_HEADS, TOKENS / SEQ_LEN), at
// most FLASH_DKV_GRID (the tiles after the last position have no queries), block FLASH_THREADS,
// static shared memory FLASH_DKV_SMEM bytes. Block (x, g, b): the keys of tile x of KV head g in
// sequence b, over the GROUP query heads that read it and, for each, the query steps of FLASH_BB
// of this rank's queries (within one chunk) from the tile's first key on; warp w its keys
// 16w..16w+15 (K, V in registers, dK, dV in fp32 accumulators). Everything is transposed (keys
// are rows): Sᵀ = K Qᵀ, dPᵀ = V dOᵀ; in the elementwise passes lane = query column, looping over
// the 16 keys. Layouts, lo and hi as flash_attention_forward's.
extern "C" __global__ void __launch_bounds__(FLASH_THREADS)
    flash_attention_backward_dkv(act *dk, act *dv, const act *dout, const act *q, const act *k, const act *v,
                                 const float *lse, const float *delta, int qld, int kld, int vld, long long lo,
                                 long long hi, int add) {
  __shared__ __align__(128) bf16 qds[2 * FLASH_BB * FLASH_LD]; // the K, then V tile; then Q and dO of each step
  __shared__ __align__(128) float scr[FLASH_WARPS][16 * FLASH_BSLD]; // Sᵀ, then dPᵀ (16, FLASH_BB)
  __shared__ __align__(128) bf16 pb[FLASH_WARPS][16 * FLASH_BPLD];   // Pᵀ (16, FLASH_BB)
  __shared__ __align__(128) bf16 dsb[FLASH_WARPS][16 * FLASH_BPLD];  // scale · dSᵀ (16, FLASH_BB)
  __shared__ float tl[FLASH_BB], td[FLASH_BB];                       // lse, delta of the step's queries
  int kvh = blockIdx.y, w = threadIdx.x / 32, lane = threadIdx.x % 32;
  int k0 = blockIdx.x * FLASH_BQ, jw = k0 + 16 * w; // jw: the warp's first key
  size_t tok0 = (size_t)blockIdx.z * SEQ_LEN, key0 = (size_t)blockIdx.z * CP_SEQ_LEN;
  const float scale = rsqrtf((float)HEAD_DIM);
  bf16 *qs = qds, *dos = qds + FLASH_BB * FLASH_LD, *P = pb[w], *DS = dsb[w];
  float *S = scr[w];
  FragA kf[HEAD_DIM / 16], vf[HEAD_DIM / 16];
  Acc dka[HEAD_DIM / 16], dva[HEAD_DIM / 16];
  flash_load(qds, k + (key0 + k0) * kld + kvh * HEAD_DIM, kld, FLASH_BQ);
  __syncthreads();
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++) wmma::load_matrix_sync(kf[d], qds + 16 * w * FLASH_LD + 16 * d, FLASH_LD);
  __syncthreads();
  flash_load(qds, v + (key0 + k0) * vld + kvh * HEAD_DIM, vld, FLASH_BQ);
  __syncthreads();
#pragma unroll
  for (int d = 0; d < HEAD_DIM / 16; d++) {
    wmma::load_matrix_sync(vf[d], qds + 16 * w * FLASH_LD + 16 * d, FLASH_LD);
    wmma::fill_fragment(dka[d], 0.f);
    wmma::fill_fragment(dva[d], 0.f);
  }
  for (int h = kvh * GROUP; h < (kvh + 1) * GROUP; h++)
    for (int ch = 0; ch < 2; ch++) {
      // chunk ch: local queries c0.. at positions p0..; its steps from the one holding position k0
      int c0 = ch * (SEQ_LEN / 2), p0 = (int)(ch ? hi : lo), from = k0 > p0 ? (k0 - p0) / FLASH_BB * FLASH_BB : 0;
      for (int q0 = c0 + from; q0 < c0 + SEQ_LEN / 2; q0 += FLASH_BB) {
        int t0 = p0 + (q0 - c0); // the step's first position
        __syncthreads(); // every warp is done with qds, tl, td
        flash_load(qs, q + (tok0 + q0) * qld + h * HEAD_DIM, qld, FLASH_BB);
        flash_load(dos, dout + ((tok0 + q0) * HEADS + h) * HEAD_DIM, HEADS * HEAD_DIM, FLASH_BB);
        if (threadIdx.x < FLASH_BB) {
          tl[threadIdx.x] = lse[(tok0 + q0 + threadIdx.x) * HEADS + h];
          td[threadIdx.x] = delta[(tok0 + q0 + threadIdx.x) * HEADS + h];
        }
        __syncthreads();
        if (t0 + FLASH_BB - 1 < jw) continue; // every query of the step is before the warp's keys
        // Sᵀ (16, FLASH_BB) = K_w Qᵀ, then Pᵀ = exp(scale · Sᵀ − lse) of the query at position t0 + lane
#pragma unroll
        for (int n = 0; n < FLASH_BB / 16; n++) {
          Acc s;
          wmma::fill_fragment(s, 0.f);
#pragma unroll
          for (int d = 0; d < HEAD_DIM / 16; d++) {
            FragBt qb;
            wmma::load_matrix_sync(qb, qs + 16 * n * FLASH_LD + 16 * d, FLASH_LD);
            wmma::mma_sync(s, kf[d], qb, s);
          }
          wmma::store_matrix_sync(S + 16 * n, s, FLASH_BSLD, wmma::mem_row_major);
        }
        __syncwarp();
        int t = t0 + lane; // this lane's query's position
        float p[16], L = tl[lane], D = td[lane];
#pragma unroll
        for (int r = 0; r < 16; r++) {
          p[r] = jw + r <= t ? __expf(scale * S[r * FLASH_BSLD + lane] - L) : 0.f;
          P[r * FLASH_BPLD + lane] = __float2bfloat16(p[r]);
        }
        __syncwarp();
        // dPᵀ (16, FLASH_BB) = V_w dOᵀ, then scale · dSᵀ = scale · Pᵀ (dPᵀ − delta)
#pragma unroll
        for (int n = 0; n < FLASH_BB / 16; n++) {
          Acc s;
          wmma::fill_fragment(s, 0.f);
#pragma unroll
          for (int d = 0; d < HEAD_DIM / 16; d++) {
            FragBt ob;
            wmma::load_matrix_sync(ob, dos + 16 * n * FLASH_LD + 16 * d, FLASH_LD);
            wmma::mma_sync(s, vf[d], ob, s);
          }
          wmma::store_matrix_sync(S + 16 * n, s, FLASH_BSLD, wmma::mem_row_major);
        }
        __syncwarp();
#pragma unroll
        for (int r = 0; r < 16; r++)
          DS[r * FLASH_BPLD + lane] = __float2bfloat16(scale * p[r] * (S[r * FLASH_BSLD + lane] - D));
        __syncwarp();
        // dV_w += Pᵀ dO, dK_w += (scale · dSᵀ) Q
        FragA pf[FLASH_BB / 16], df[FLASH_BB / 16];
#pragma unroll
        for (int c = 0; c < FLASH_BB / 16; c++) {
          wmma::load_matrix_sync(pf[c], P + 16 * c, FLASH_BPLD);
          wmma::load_matrix_sync(df[c], DS + 16 * c, FLASH_BPLD);
        }
#pragma unroll
        for (int d = 0; d < HEAD_DIM / 16; d++)
#pragma unroll
          for (int c = 0; c < FLASH_BB / 16; c++) {
            FragB ob, qb;
            wmma::load_matrix_sync(ob, dos + 16 * c * FLASH_LD + 16 * d, FLASH_LD);
            wmma::mma_sync(dva[d], pf[c], ob, dva[d]);
            wmma::load_matrix_sync(qb, qs + 16 * c * FLASH_LD + 16 * d, FLASH_LD);
            wmma::mma_sync(dka[d], df[c], qb, dka[d]);
          }
      }
    }
  act *dkw = dk + (key0 + jw) * kld + kvh * HEAD_DIM, *dvw = dv + (key0 + jw) * vld + kvh * HEAD_DIM;
  if (add) {
    flash_write<HEAD_DIM / 16, FLASH_BB / 16, true>(dkw, kld, dka, S, FLASH_BSLD);
    flash_write<HEAD_DIM / 16, FLASH_BB / 16, true>(dvw, vld, dva, S, FLASH_BSLD);
  } else {
    flash_write<HEAD_DIM / 16, FLASH_BB / 16, false>(dkw, kld, dka, S, FLASH_BSLD);
    flash_write<HEAD_DIM / 16, FLASH_BB / 16, false>(dvw, vld, dva, S, FLASH_BSLD);
  }
}
#endif // HAVE_FLASH_ATTENTION
