/* comm_cp.c — context parallelism's collectives on the cpu backend (mtrt_comm.h): the keys and
 * values of a cp group's chunks all-gathered into position order, their gradient reduce-scattered
 * back, and the balancing loss's statistics averaged.
 *
 * Chunk j of a sequence (2 cp chunks of c = T / 2 tokens) is rank j's first chunk for j < cp and
 * rank 2 cp - 1 - j's second for j >= cp: the first chunks all-gather straight into slots 0..cp-1
 * (rank order), the second chunks into slots cp..2 cp - 1 in rank order, which is reversed. */
#include <string.h>

#include "mtrt_comm.h"

/* Reverses the order of n blocks of len values at x, in place. */
static void reverse_blocks(act *x, int n, size_t len) {
  for (int i = 0; i < n / 2; i++) {
    act *a = x + (size_t)i * len, *b = x + (size_t)(n - 1 - i) * len;
    for (size_t k = 0; k < len; k++) {
      act t = a[k];
      a[k] = b[k], b[k] = t;
    }
  }
}

void rt_comm_cp_gather(MPI_Comm comm, int cp, act *full, const act *local, int B, int T, int64_t width) {
  size_t c = (size_t)(T / 2) * (size_t)width, S = (size_t)cp * (size_t)T * (size_t)width;
  for (int b = 0; b < B; b++) {
    act *f = full + (size_t)b * S;
    const act *l = local + (size_t)b * T * (size_t)width;
    rt_comm_all_gather(comm, f, l, c);
    rt_comm_all_gather(comm, f + (size_t)cp * c, l + c, c);
    reverse_blocks(f + (size_t)cp * c, cp, c);
  }
}

void rt_comm_cp_reduce_scatter(MPI_Comm comm, int cp, act *local, act *full, int B, int T, int64_t width) {
  size_t c = (size_t)(T / 2) * (size_t)width, S = (size_t)cp * (size_t)T * (size_t)width;
  for (int b = 0; b < B; b++) {
    act *f = full + (size_t)b * S, *l = local + (size_t)b * T * (size_t)width;
    rt_comm_reduce_scatter(comm, l, f, c);
    reverse_blocks(f + (size_t)cp * c, cp, c);
    rt_comm_reduce_scatter(comm, l + c, f + (size_t)cp * c, c);
  }
}

void rt_comm_cp_mean(MPI_Comm comm, int cp, real *buf, size_t n) {
  rt_comm_all_reduce(comm, buf, n);
  for (size_t i = 0; i < n; i++) buf[i] /= (real)cp;
}
