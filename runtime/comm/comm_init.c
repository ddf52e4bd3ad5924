/* comm_init.c — bootstrap over MPI, shared by both backends: the plan's groups, the host-side
 * all-reduce of scalars and bf16 conversion (the MoE exchange's arrays: a2a_plan.c). Every MPI call is
 * checked: a failure prints the host, rank, file, line and MPI's message, then aborts the job
 * (a collective that fails on one rank would hang the others). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtrt_comm.h"

#define MPI_CHECK(call) RT_MPI_CHECK(call)

static const char *where = "start-up";

void rt_comm_label(const char *w) { where = w; }
const char *rt_comm_where(void) { return where; }

void rt_mpi_fail(int rc, const char *call, const char *file, int line) {
  char msg[MPI_MAX_ERROR_STRING], host[MPI_MAX_PROCESSOR_NAME];
  int len = 0, hl = 0, rank = -1;
  MPI_Error_string(rc, msg, &len);
  MPI_Get_processor_name(host, &hl);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  fprintf(stderr, "%s rank %d: %s:%d: %s failed (at %s): %s\n", host, rank, file, line, call, where, msg);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int rt_mpi_count(size_t n, const char *what) {
  if (n > INT_MAX) {
    fprintf(stderr, "mtrt: %s: %zu exceeds MPI's int count (at %s)\n", what, n, where);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return (int)n;
}

size_t rt_mpi_piece_max(void) {
  static size_t piece;
  if (!piece) {
    const char *v = getenv("MTC_MPI_PIECE");
    long long n = v ? atoll(v) : 0;
    piece = n > 0 && n <= INT_MAX ? (size_t)n : (size_t)1 << 30;
  }
  return piece;
}

size_t rt_mpi_piece_len(size_t count, size_t at, size_t piece) { return count - at < piece ? count - at : piece; }

size_t rt_mpi_pieces(size_t count, size_t piece) { return count / piece + (count % piece != 0); }

int rt_comm_init(RtComm *c, int *argc, char ***argv, int fsdp, int ep, int dp_replicate, const char *spec,
                 int gpus_per_node) {
  int inited = 0;
  MPI_CHECK(MPI_Initialized(&inited));
  if (!inited) MPI_CHECK(MPI_Init(argc, argv));
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &c->world));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank));
  int planned = fsdp * dp_replicate;
  if (c->world != planned || ep < 1 || fsdp % ep != 0) {
    char fit[160];
    if (gpus_per_node > 0 && c->world % gpus_per_node == 0)
      snprintf(fit, sizeof fit, "--set cluster.nodes=%d", c->world / gpus_per_node);
    else
      snprintf(fit, sizeof fit, "--set cluster.nodes=1 --set cluster.gpus_per_node=%d", c->world);
    if (c->rank == 0)
      fprintf(stderr, "error: this program was planned for %d rank%s (fsdp %d x dp_replicate %d, ep %d) but was "
                      "launched with %d; expected mpirun -np %d, or a plan for %d rank%s: mtc compile SPEC %s (SPEC: "
                      "the path of the %s it was compiled from, with the --set options it was compiled with)\n",
              planned, planned == 1 ? "" : "s", fsdp, dp_replicate, ep, c->world, planned, c->world,
              c->world == 1 ? "" : "s", fit, spec);
    return -1;
  }
  c->fsdp = fsdp, c->ep = ep, c->dp_replicate = dp_replicate;
  c->replica = c->rank / fsdp;
  c->fsdp_rank = c->rank % fsdp;
  c->ep_rank = c->fsdp_rank % ep;
  c->shard_rank = c->fsdp_rank / ep;
  /* EP group: ep consecutive ranks of an FSDP group (ep_rank = fsdp_rank % ep), as the plan lays
   * them out: inside one node when ep divides gpus_per_node, else ep / gpus_per_node whole nodes,
   * given that ranks fill nodes in blocks (launch.sbatch's --ntasks-per-node with srun's default
   * block distribution; mpirun --map-by slot). The shard group: the fsdp / ep ranks with one
   * ep_rank, ep apart. */
  int groups_per_replica = fsdp / ep;
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, c->replica, c->fsdp_rank, &c->fsdp_comm));
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, c->replica * groups_per_replica + c->shard_rank, c->ep_rank,
                           &c->ep_comm));
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, c->replica * ep + c->ep_rank, c->shard_rank, &c->shard_comm));
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, c->fsdp_rank, c->replica, &c->replicate_comm));
  c->cp = 1, c->cp_rank = 0, c->cp_comm = MPI_COMM_NULL;
  return 0;
}

void rt_comm_cp_init(RtComm *c, int cp) {
  if (cp <= 1) return;
  c->cp = cp, c->cp_rank = c->fsdp_rank % cp;
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, c->replica * (c->fsdp / cp) + c->fsdp_rank / cp, c->cp_rank, &c->cp_comm));
}

void rt_comm_finalize(RtComm *c) {
  if (c->fsdp_comm) {
    MPI_Comm_free(&c->fsdp_comm);
    MPI_Comm_free(&c->ep_comm);
    MPI_Comm_free(&c->shard_comm);
    MPI_Comm_free(&c->replicate_comm);
  }
  if (c->cp_comm != MPI_COMM_NULL && c->cp > 1) MPI_Comm_free(&c->cp_comm);
  MPI_Finalize();
}

uint16_t rt_bf16_from_float(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float rt_float_from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* In place, so past MPI's int count it goes in pieces (every rank has the same count). */
void rt_comm_all_reduce(MPI_Comm comm, real *buf, size_t count) {
  const size_t piece = rt_mpi_piece_max();
  for (size_t at = 0; at < count; at += piece) {
    int n = rt_mpi_count(rt_mpi_piece_len(count, at, piece), "all-reduce values");
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf + at, n, MTRT_MPI_REAL, MPI_SUM, comm));
  }
}
