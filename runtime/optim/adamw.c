/* adamw.c — AdamW, the learning-rate schedule and gradient clipping. */
#include <math.h>

#include "mtrt_optim.h"

void rt_adamw_update(real *param, float *m, float *v, const real *grad, size_t n, float grad_scale,
                     const RtAdamW *h) {
  float c1 = 1 - powf(h->beta1, (float)h->step), c2 = 1 - powf(h->beta2, (float)h->step);
  for (size_t i = 0; i < n; i++) {
    float g = (float)grad[i] * grad_scale;
    m[i] = h->beta1 * m[i] + (1 - h->beta1) * g;
    v[i] = h->beta2 * v[i] + (1 - h->beta2) * g * g;
    float update = (m[i] / c1) / (sqrtf(v[i] / c2) + h->eps);
    param[i] -= h->lr * (update + h->weight_decay * (float)param[i]);
  }
}

float rt_lr_at(int64_t s, int64_t steps, int64_t warmup, float lr, float min_ratio) {
  if (s < warmup) return (float)((double)lr * (double)(s + 1) / (double)warmup);
  if (steps <= warmup + 1) return lr;
  float progress = (float)((double)(s - warmup) / (double)(steps - warmup - 1));
  if (progress > 1) progress = 1;
  float cosine = 0.5f * (1 + cosf((float)M_PI * progress));
  return lr * (min_ratio + (1 - min_ratio) * cosine);
}

double rt_sum_squares(const real *g, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)g[i] * g[i];
  return s;
}

float rt_clip_scale(double norm, float max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1;
  return (float)(max_norm / (norm + 1e-6));
}
