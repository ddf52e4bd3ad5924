/* train_cuda.c — the optimizer step on the device: AdamW over a shard's tensors (the kernel of
 * kernels.cu, one launch per tensor piece, with or without weight decay) and the squared norm
 * of a gradient shard. */
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

double rt_cu_sum_squares(const float *g, size_t n) {
  double *out = cu.red, s = 0;
  long ln = (long)n;
  cu_check(cudaMemsetAsync(out, 0, sizeof(double), cu.stream), "sum of squares");
  unsigned blocks = cu_blocks(ln, 256);
  if (blocks > 1024) blocks = 1024; /* the kernel strides over the rest */
  cu_launch(K_SUM_SQUARES, blocks, 256, (void *[]){&out, &g, &ln});
  rt_cuda_download(&s, out, sizeof s);
  return s;
}
