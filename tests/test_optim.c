/* test_optim.c — AdamW against a hand computation, the schedule's shape, clipping; AdamW over
 * a shard of a group that mixes Muon matrices and AdamW tensors (the compacted second moment). */
#include "check.h"
#include "mtrt_optim.h"
#include "mtrt_train.h"

/* rt_adamw_shard on rank 1's shard [3, 53) of a group of a norm (0..5, AdamW), a Muon matrix
 * (5..45) and a router (48..60, AdamW; 45..48 a gap): the second moment holds the 7 AdamW values
 * of the shard one after another (norm 3..5, router 48..53), and the result equals
 * rt_adamw_update on each AdamW piece with its own moments; Muon's values are not touched. */
static void mixed_shard(void) {
  const RtTensor t[3] = {{"n", 0, 0, 5, 0, 5, 1, 0, true, false, false, 0, 0, 0},
                         {"w", 0, 5, 40, 0, 8, 5, 0.02f, false, true, true, 0, 0, 0},
                         {"r", 0, 48, 12, 0, 3, 4, 0.02f, false, true, false, 0, 0, 0}};
  enum { LO = 3, HI = 53, S = HI - LO };
  float p[S], m[S], g[S], v[7] = {0}, p2[S], m2[S], v2[S] = {0};
  for (int i = 0; i < S; i++) p[i] = p2[i] = 0.01f * (float)(i + 1), m[i] = m2[i] = 0, g[i] = 0.1f * (float)(i % 7) - 0.3f;
  RtAdamW h = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 1};
  for (int step = 1; step <= 2; step++) {
    h.step = step;
    rt_adamw_shard(p, m, v, g, t, 3, 0, LO, HI, 1.0f, &h);
    RtAdamW nodecay = h;
    nodecay.weight_decay = 0;
    rt_adamw_update(p2, m2, v2, g, 5 - LO, 1.0f, &nodecay); /* the norm: no decay */
    rt_adamw_update(p2 + 48 - LO, m2 + 48 - LO, v2 + 48 - LO, g + 48 - LO, HI - 48, 1.0f, &h);
  }
  for (int i = 0; i < S; i++) CHECK(p[i] == p2[i] && m[i] == m2[i]);
  for (int i = 0; i < 5 - LO; i++) CHECK(v[i] == v2[i]);
  for (int i = 0; i < HI - 48; i++) CHECK(v[5 - LO + i] == v2[48 - LO + i]);
  for (int i = 5 - LO; i < 45 - LO; i++) CHECK(p[i] == 0.01f * (float)(i + 1) && m[i] == 0); /* Muon's */
  CHECK(v[6] != 0);
}

int main(void) {
  /* one step from zero moments: m = (1-b1) g, v = (1-b2) g², bias-corrected update = g / |g| */
  float p[2] = {1.0f, -2.0f}, m[2] = {0}, v[2] = {0}, g[2] = {0.5f, -4.0f};
  RtAdamW h = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 1};
  rt_adamw_update(p, m, v, g, 2, 1.0f, &h);
  CHECK_NEAR(p[0], 1.0 - 0.1 * (1.0 + 0.1 * 1.0), 1e-6);
  CHECK_NEAR(p[1], -2.0 - 0.1 * (-1.0 + 0.1 * -2.0), 1e-6);
  CHECK_NEAR(m[0], 0.05, 1e-6);
  CHECK_NEAR(v[1], 0.05 * 16, 1e-6);
  /* a second step by hand: m = 0.9 m + 0.1 g, v = 0.95 v + 0.05 g², corrections 1 − b^2 */
  float p0 = p[0];
  h.step = 2, h.weight_decay = 0;
  rt_adamw_update(p, m, v, g, 2, 0.5f, &h); /* grad_scale halves the gradient */
  double g2 = 0.25, m2 = 0.9 * 0.05 + 0.1 * g2, v2 = 0.95 * (0.05 * 0.25) + 0.05 * g2 * g2;
  double want = p0 - 0.1 * (m2 / (1 - 0.81)) / (sqrt(v2 / (1 - 0.9025)) + 1e-8);
  CHECK_NEAR(p[0], want, 1e-5);

  /* schedule: warmup 10 of 100 steps to 1e-3, cosine to 10% */
  CHECK_NEAR(rt_lr_at(0, 100, 10, 1e-3f, 0.1f), 1e-4, 1e-6);
  CHECK_NEAR(rt_lr_at(9, 100, 10, 1e-3f, 0.1f), 1e-3, 1e-6);
  CHECK_NEAR(rt_lr_at(10, 100, 10, 1e-3f, 0.1f), 1e-3, 1e-6);
  CHECK_NEAR(rt_lr_at(99, 100, 10, 1e-3f, 0.1f), 1e-4, 1e-5);
  CHECK_NEAR(rt_lr_at(54, 100, 10, 1e-3f, 0.1f), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 44.0 / 89.0))), 1e-5);
  for (int s = 10; s < 99; s++) CHECK(rt_lr_at(s + 1, 100, 10, 1e-3f, 0.1f) <= rt_lr_at(s, 100, 10, 1e-3f, 0.1f));
  /* steps past 2^31 (issue 16 item 10): 2^32 + 40 steps is not 40 steps, and the middle is halfway */
  const int64_t big = ((int64_t)1 << 32) + 40;
  CHECK_NEAR(rt_lr_at(40, big, 0, 1e-3f, 0.1f), 1e-3, 1e-6);
  CHECK_NEAR(rt_lr_at(big / 2, big, 0, 1e-3f, 0.1f), 1e-3 * 0.55, 1e-5);
  CHECK_NEAR(rt_lr_at(big - 1, big, 0, 1e-3f, 0.1f), 1e-4, 1e-5);
  CHECK_NEAR(rt_lr_at(((int64_t)1 << 33) - 1, (int64_t)1 << 40, (int64_t)1 << 33, 1e-3f, 0.1f), 1e-3, 1e-6);

  /* clipping */
  float gg[3] = {3, 4, 0};
  double norm = sqrt(rt_sum_squares(gg, 3));
  CHECK_NEAR(norm, 5.0, 1e-12);
  CHECK_NEAR(rt_clip_scale(norm, 1.0f), 0.2, 1e-6);
  CHECK(rt_clip_scale(norm, 10.0f) == 1.0f);
  CHECK(rt_clip_scale(norm, 0.0f) == 1.0f);
  CHECK(rt_clip_scale(NAN, 1.0f) == 1.0f); /* a non-finite norm is the guard rails' business */
  mixed_shard();
  return CHECK_DONE("test_optim");
}
