/*
 * mtrt_comm.h — libmtrt's bootstrap and collectives over MPI (the cpu backend; the cuda
 * backend bootstraps NCCL over the same groups).
 *
 * Ranks follow the plan's layout: world = dp_replicate × fsdp. World rank w is in replica
 * w / fsdp at FSDP rank f = w % fsdp; its EP rank is f % ep (EP groups are ep consecutive
 * ranks, inside a node) and it shards its EP rank's experts with the fsdp / ep ranks of its
 * replica that have the same EP rank (the expert-shard group, index f / ep).
 */
#ifndef MTRT_COMM_H
#define MTRT_COMM_H

#include <mpi.h>
#include <stddef.h>

/* One process's place in the layout and a communicator per group. */
typedef struct {
  int world, rank;
  int fsdp, ep, dp_replicate;
  int replica, fsdp_rank, ep_rank, shard_rank;
  MPI_Comm fsdp_comm;      /* the fsdp ranks of one replica: dense parameters */
  MPI_Comm ep_comm;        /* ep consecutive ranks: the token all-to-all */
  MPI_Comm shard_comm;     /* fsdp / ep ranks with one EP rank: expert parameters */
  MPI_Comm replicate_comm; /* one FSDP rank across replicas: gradient all-reduce */
} RtComm;

/* Initializes MPI (a world of 1 runs without mpirun) and splits the groups of a plan with
 * world = fsdp × dp_replicate. If the launch has another world size, prints both numbers and
 * what to do (relaunch, or `recompile` — the mtc compile command that fits) and returns -1;
 * returns 0 on success. */
int rt_comm_init(RtComm *c, int *argc, char ***argv, int fsdp, int ep, int dp_replicate,
                 const char *recompile);
void rt_comm_finalize(RtComm *c);

/* out (g × count floats, rank order) = every rank's in (count floats) in group comm. */
void rt_comm_all_gather(MPI_Comm comm, float *out, const float *in, size_t count);
/* out (count) = Σ over ranks of in[rank × count .. +count) (in: g × count floats). */
void rt_comm_reduce_scatter(MPI_Comm comm, float *out, const float *in, size_t count);
/* buf (count) = Σ over ranks of buf, in place. */
void rt_comm_all_reduce(MPI_Comm comm, float *buf, size_t count);
/* Variable all-to-all of floats: send[sdispl[r] .. + scount[r]) goes to rank r, which
 * receives it at recv[rdispl[me] ...]; counts and displacements in floats, g entries each. */
void rt_comm_all_to_all_v(MPI_Comm comm, const float *send, const int *scount, const int *sdispl,
                          float *recv, const int *rcount, const int *rdispl);

#endif
