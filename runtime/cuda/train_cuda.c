/* train_cuda.c — the optimizer step on the device: AdamW over a shard's tensors (the kernel of
 * kernels.cu, one launch per tensor piece, with or without weight decay) and the squared norm
 * of a gradient shard; the step's scalars (losses and sums of squares) read in one copy; the
 * gradients' clear before a step. */
#include <math.h>

#include "cu_internal.h"

void rt_cu_adamw_shard(float *param, float *m, float *v, const float *grad, const RtTensor *t, int nt, int g, int64_t lo,
                       int64_t hi, float grad_scale, const RtAdamW *h) {
  float c1 = 1 - powf(h->beta1, (float)h->step), c2 = 1 - powf(h->beta2, (float)h->step);
  float lr = h->lr, b1 = h->beta1, b2 = h->beta2, eps = h->eps;
  int64_t vat = 0; /* the second moment: the AdamW pieces' values one after another (rt_adamw_shard) */
  RT_FOR_PIECES(t, nt, g, lo, hi, {
    (void)first;
    if (T->muon) continue;
    float *p = param + at;
    float *mm = m + at;
    float *vv = v + vat;
    vat += len;
    const float *gr = grad + at;
    long n = (long)len;
    float wd = T->decay ? h->weight_decay : 0;
    cu_launch(K_ADAMW, cu_blocks(n, 256), 256, (void *[]){&p, &mm, &vv, &gr, &n, &lr, &b1, &b2, &eps, &wd, &c1, &c2,
                                                           &grad_scale});
  })
}

void rt_cu_zero_state(float *x, size_t n) {
  float zero = 0;
  long ln = (long)n;
  if (ln) cu_launch(K_FILL, cu_blocks(ln, 256), 256, (void *[]){&x, &zero, &ln});
}

/* Σ g² of n values into cu.red (device double). */
static void sum_squares(const float *g, size_t n) {
  double *out = cu.red;
  long ln = (long)n;
  cu_check(cudaMemsetAsync(out, 0, sizeof(double), cu.stream), "sum of squares");
  unsigned blocks = cu_blocks(ln, 256);
  if (blocks > 1024) blocks = 1024; /* the kernel strides over the rest */
  cu_launch(K_SUM_SQUARES, blocks, 256, (void *[]){&out, &g, &ln});
}

double rt_cu_sum_squares(const float *g, size_t n) {
  double s = 0;
  sum_squares(g, n);
  rt_cuda_download(&s, cu.red, sizeof s);
  return s;
}

/* ---- the step's scalars, read in one copy at its end ----
 * The losses and sums of squares are copied into the pinned readback buffer as they are
 * computed (no host wait), and folded on the host in the order they came, with the arithmetic of
 * the loop that read each one at once (train.c: the losses' mean per micro-batch in float, summed
 * in double; the sums of squares rounded to float and summed in float): bit for bit the same
 * figures. A full buffer (more than CU_SCALARS of a kind in a step) is folded early. */

void rt_cu_defer_scalars(int on) { cu.defer = on; }

/* The scalars copied so far, folded into cu.loss_acc and cu.sq_acc (one host wait). */
static void fold(void) {
  size_t lo, st;
  cu_rb_layout((size_t)(cu.cfg.experts > 0 ? cu.cfg.experts : 1), &lo, &st);
  if (!cu.n_loss && !cu.n_sq) return;
  rt_cu_host_wait("the step's loss and gradient norm");
  const double *sq = cu.rb;
  const float *loss = (const float *)((const char *)cu.rb + lo);
  for (int i = 0; i < cu.n_loss; i++) cu.loss_acc += (double)(loss[i] / (real)cu.loss_n[i]);
  for (int i = 0; i < cu.n_sq; i++) cu.sq_acc += (real)sq[i];
  cu.n_loss = cu.n_sq = 0;
}

void cu_defer_loss(const float *sum, int N) {
  size_t lo, st;
  cu_rb_layout((size_t)(cu.cfg.experts > 0 ? cu.cfg.experts : 1), &lo, &st);
  if (cu.n_loss == CU_SCALARS) fold();
  cu.loss_n[cu.n_loss] = N;
  float *slot = (float *)((char *)cu.rb + lo) + cu.n_loss++;
  cu_check(cudaMemcpyAsync(slot, sum, sizeof(float), cudaMemcpyDeviceToHost, cu.stream), "cross-entropy (deferred)");
}

void rt_cu_sum_squares_defer(const float *g, size_t n) {
  if (cu.n_sq == CU_SCALARS) fold();
  sum_squares(g, n);
  double *slot = (double *)cu.rb + cu.n_sq++;
  cu_check(cudaMemcpyAsync(slot, cu.red, sizeof(double), cudaMemcpyDeviceToHost, cu.stream), "sum of squares");
}

real rt_cu_step_scalars(double *loss) {
  fold();
  real sq = cu.sq_acc;
  *loss += cu.loss_acc;
  cu.loss_acc = 0, cu.sq_acc = 0;
  return sq;
}
