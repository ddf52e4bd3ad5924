/* test_kernels_optim.c — test_kernels' checks of the device optimizer (train_cuda.c's AdamW and
 * squared norm, templates/kernels/50-optim.cu) and muon_cuda.c's Newton-Schulz against the host's
 * (test_kernels.h). */
#include "test_kernels.h"


/* The device optimizer against the host's: AdamW over a shard [LO, HI) of group 0 that cuts
 * tensors, skips the Muon tensor and another group's, and decays only where decay is set; the
 * squared norm over more values than the kernel's 1024 blocks of 256 cover in one sweep. */
void test_optimizer(void) {
  enum { LO = 250, HI = 880, S = HI - LO, NS = 300000 };
  static const RtTensor t[] = {
      {.name = "w", .group = 0, .offset = 0, .count = 300, .decay = true},
      {.name = "norm", .group = 0, .offset = 300, .count = 100, .init_one = true},
      {.name = "muon", .group = 0, .offset = 400, .count = 200, .muon = true, .decay = true},
      {.name = "experts", .group = 0, .offset = 600, .count = 150, .experts = 2, .decay = true},
      {.name = "other", .group = 1, .offset = 0, .count = 700, .decay = true},
  };
  RtAdamW hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3};
  float *par = rnd(S, 2), *m = rnd(S, 0.2f), *v = rnd(S, 0.02f), *grad = rnd(S, 2);
  for (int i = 0; i < S; i++) v[i] = fabsf(v[i]);
  float *dpar = devf(par, S), *dm = devf(m, S), *dv = devf(v, S), *dgrad = devf(grad, S);
  rt_adamw_shard(par, m, v, grad, t, 5, 0, LO, HI, 0.5f, &hp);
  rt_cu_adamw_shard(dpar, dm, dv, dgrad, t, 5, 0, LO, HI, 0.5f, &hp);
  check_dev("adamw param", dpar, par, S, TOL);
  check_dev("adamw m", dm, m, S, TOL);
  check_dev("adamw v", dv, v, S, TOL);
  float *g = rnd(NS, 2);
  check_scalar("sum_squares", rt_cu_sum_squares(devf(g, NS), NS), rt_sum_squares(g, NS), 1e-5);
}


/* Eigenvalues of the symmetric n × n matrix a (destroyed) by cyclic Jacobi rotations (double). */
static void jacobi(double *a, int n, double *eig) {
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) off += a[p * n + q] * a[p * n + q];
    if (off < 1e-22) break;
    for (int p = 0; p < n; p++)
      for (int q = p + 1; q < n; q++) {
        double apq = a[p * n + q];
        if (fabs(apq) < 1e-300) continue;
        double th = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        double t = (th >= 0 ? 1 : -1) / (fabs(th) + sqrt(th * th + 1)), c = 1 / sqrt(t * t + 1), sn = t * c;
        for (int k = 0; k < n; k++) {
          double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - sn * akq, a[k * n + q] = sn * akp + c * akq;
        }
        for (int k = 0; k < n; k++) {
          double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - sn * aqk, a[q * n + k] = sn * apk + c * aqk;
        }
      }
  }
  for (int i = 0; i < n; i++) eig[i] = a[i * n + i];
}


/* The range [lo, hi] of the singular values of u (rows, cols, host) / scale: the square roots of
 * the eigenvalues of the short side's Gram matrix. */
static void sv_range(const float *u, int rows, int cols, double scale, double *lo, double *hi) {
  int r = rows < cols ? rows : cols, k = rows < cols ? cols : rows;
  double *gram = calloc((size_t)r * r, sizeof(double)), *eig = malloc(sizeof(double) * (size_t)r);
  for (int i = 0; i < r; i++)
    for (int j = 0; j < r; j++)
      for (int l = 0; l < k; l++)
        gram[i * r + j] += rows < cols ? (double)u[i * cols + l] * u[j * cols + l] : (double)u[l * cols + i] * u[l * cols + j];
  jacobi(gram, r, eig);
  *lo = 1e9, *hi = 0;
  for (int i = 0; i < r; i++) {
    double sv = sqrt(fmax(eig[i], 0)) / scale;
    *lo = fmin(*lo, sv), *hi = fmax(*hi, sv);
  }
  free(gram), free(eig);
}


/* Muon's Newton-Schulz on the device (rt_cu_newton_schulz: batches of cuBLAS strided GEMMs of
 * bf16 operands, fp32 accumulation) against the host's (rt_newton_schulz in fp32, times Muon's
 * scale), for a batch of tall matrices (the transposed path) and one of wide ones, in place as the
 * Muon step runs it: within 8e-2 of the largest value (the operands' bf16 rounding, 2^-9
 * relative, grows along the small singular directions, where the quintic's slope is a = 3.4 per
 * iteration, up to ~3.4^5 over five; 2.5e-2 to 2.9e-2 measured on the emulation); and the singular
 * values of every result in the quintic's band, about [0.68, 1.13] (checked as [0.65, 1.16]), the
 * property Muon needs. */
void test_newton_schulz(void) {
  static const int shapes[][3] = {{3, 40, 24}, {2, 16, 32}}; /* batch, rows, cols */
  for (int s = 0; s < 2; s++) {
    int b = shapes[s][0], rows = shapes[s][1], cols = shapes[s][2], n = rows * cols;
    float scale = (float)(0.2 * sqrt((double)(rows > cols ? rows : cols)));
    float *g = rnd((size_t)b * n, 2), *ref = host((size_t)b * n), *got = host((size_t)b * n);
    float *work = host(rt_newton_schulz_work(rows, cols));
    for (int i = 0; i < b; i++) {
      rt_newton_schulz(ref + (size_t)i * n, g + (size_t)i * n, rows, cols, work);
      for (int j = 0; j < n; j++) ref[(size_t)i * n + j] *= scale;
    }
    float *dg = devf(g, (size_t)b * n), *dw = devf(NULL, rt_cu_newton_schulz_work(b, rows, cols));
    rt_cu_newton_schulz(dg, dg, b, rows, cols, scale, dw);
    check_real(s ? "newton_schulz wide" : "newton_schulz tall (batch 3)", dg, ref, (size_t)b * n, 8e-2);
    rt_cuda_download(got, dg, sizeof(float) * (size_t)b * n);
    double lo = 1e9, hi = 0;
    for (int i = 0; i < b; i++) {
      double l, h;
      sv_range(got + (size_t)i * n, rows, cols, scale, &l, &h);
      lo = fmin(lo, l), hi = fmax(hi, h);
    }
    printf("test_kernels: Newton-Schulz %d x (%d, %d) on the device: singular values in [%.3f, %.3f]\n", b, rows, cols,
           lo, hi);
    CHECK(lo >= 0.65 && hi <= 1.16);
  }
}
