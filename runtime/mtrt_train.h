/*
 * mtrt_train.h — what a generated training program (train.c + its step.c) shares with the
 * runtime: the tables that describe its parameters, layout-independent initialization,
 * the sharded AdamW step, and metrics.
 *
 * Parameters live in groups: one per layer's dense part (norms, attention, router, shared
 * experts, dense MLP), one per layer's routed experts of this rank's EP rank, one for the
 * embedding and one for the head (final norm, LM head). A group is one vector, padded to a
 * multiple of the ranks it is sharded over (the FSDP group, or for experts the fsdp / ep ranks
 * with the same EP rank), each rank holding one contiguous shard of it. Dense groups are laid
 * out tensor after tensor (flat shards); an expert group is laid out shard after shard, each
 * shard holding whole experts of every routed tensor (RtTensor.per, block; rt_expert_at), where
 * the compiler's one rule (plan_expert_per) says so: its ranks (more than one) divide the EP
 * rank's experts; otherwise it is flat like a dense group (per 0). Each rank keeps the fp32 master shard, its gradient and its optimizer
 * moments at offsets the compiler chose in the program's state arena (in the tier the plan
 * chose: device memory, or host memory that the GPU reads over C2C).
 */
#ifndef MTRT_TRAIN_H
#define MTRT_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

#include "mtrt_ckpt.h"
#include "mtrt_comm.h"
#include "mtrt_hier.h"
#include "mtrt_optim.h"
#include "mtrt_real.h"

enum { RT_GROUP_FSDP, RT_GROUP_EXPERT_SHARD };

/* A parameter tensor in its group. */
typedef struct {
  const char *name;   /* Hugging Face name; routed experts: a pattern whose %d is the global
                         expert index (EP rank × experts per rank + k) */
  int group;          /* index in the program's group table */
  int64_t offset;     /* first element in the group's gathered vector */
  int64_t count;      /* elements (of one expert, for routed tensors) */
  int experts;        /* routed: this many experts stored one after another; else 0 */
  int64_t rows, cols; /* shape as PyTorch's [out, in]; vectors have cols = 1 */
  float init_std;     /* initial values ~ N(0, init_std²), or all 1 when init_one (norms) */
  bool init_one;
  bool decay;         /* weight decay applies (matrices; not norms or biases) */
  bool muon;          /* optimized by Muon (2-D hidden matrices when the spec says muon) */
  int owner;          /* Muon: the rank of the group's communicator that orthogonalizes it
                         (routed: expert k's owner is (owner + k) mod the group's ranks); a
                         matrix that lies whole in one rank's shard is orthogonalized there */
  int per;            /* routed, whole-expert shards: experts per shard (0: flat, expert k at
                         offset + k·count) */
  int64_t block;      /* whole-expert shards: the group's shard size; expert k at offset +
                         (k / per)·block + (k % per)·count (offset is inside the first shard) */
} RtTensor;

/* The first element of expert k (0 when not routed) of T in its group's gathered vector. */
static inline int64_t rt_expert_at(const RtTensor *T, int k) {
  if (T->per > 0) return T->offset + (int64_t)(k / T->per) * T->block + (int64_t)(k % T->per) * T->count;
  return T->offset + (int64_t)k * T->count;
}

/* A group of parameters sharded over one communicator. */
typedef struct {
  const char *name;   /* "layer 2 dense" */
  int comm;           /* RT_GROUP_FSDP or RT_GROUP_EXPERT_SHARD */
  int64_t full;       /* elements gathered (padded to a multiple of the group's ranks) */
  int64_t shard;      /* elements per rank: full / ranks */
  int64_t master, grad, adam_m, adam_v; /* element offsets in the state arena; adam_v -1 for a group
                                           of Muon matrices only (Muon's momentum is adam_m). The
                                           second moment holds only the values of the group's AdamW
                                           tensors in the shard, compacted: the pieces of
                                           RT_FOR_PIECES that are not Muon's, one after another */
  int64_t param;      /* element offset in the activation arena of the master shard cast to the
                         activation type, which the all-gathers read; -1 when step.c casts it
                         before each gather (the master in HBM) */
} RtGroup;

/* Runs BODY for every piece of a tensor of group g inside the gathered range [lo, hi), with T
 * the tensor, k its expert (0 when not routed), first the index in the tensor (expert) of the
 * piece's first element, at where the piece starts in the shard and len its length. */
#define RT_FOR_PIECES(t, nt, g, lo, hi, BODY)                                                   \
  for (int ti = 0; ti < (nt); ti++) {                                                        \
    const RtTensor *T = &(t)[ti];                                                            \
    if (T->group != (g)) continue;                                                           \
    int ne = T->experts ? T->experts : 1;                                                    \
    for (int k = 0; k < ne; k++) {                                                           \
      int64_t a0 = rt_expert_at(T, k), a = a0, b = a + T->count;                             \
      if (a < (lo)) a = (lo);                                                                \
      if (b > (hi)) b = (hi);                                                                \
      if (a >= b) continue;                                                                  \
      int64_t first = a - a0, at = a - (lo), len = b - a;                                    \
      BODY                                                                                   \
    }                                                                                        \
  }

/* What rt_muon_group did on this rank (added to): matrices orthogonalized where they are held
 * (no communication) and as the owner of gathered pieces; values sent to owners and received
 * by this one (each also goes back the other way). */
typedef struct {
  int64_t local, owned, sent, received;
  int64_t large;     /* all-to-alls sent with derived datatypes (past rt_muon_msg_limit) */
  int64_t exchanges; /* gather-and-return exchanges (one per call that moved anything) */
} RtMuonStats;

/* One group's shard for a Muon step over several groups of one communicator: group g's shard
 * of S values on this rank (param, mom, grad: as rt_muon_group's), and for the exchange of
 * rt_muon_exchange_start/finish its Nesterov gradients on the host at shard indices (nest). */
typedef struct {
  int g;
  int64_t S;
  real *param;
  float *mom;
  const real *grad;
  real *nest;
} RtMuonShard;

/* One Muon step of every Muon matrix of group g (shards of S on each of the ranks of comm:
 * this rank's param, mom, grad hold gathered elements [rank·S, (rank+1)·S)). Each rank updates
 * the momentum of its pieces (Nesterov: g + μ·m, g scaled by grad_scale). A matrix whole in
 * one shard is orthogonalized by that rank with no communication; the other matrices' pieces go
 * to their owners (RtTensor.owner) in one all-to-all (MPI_Ialltoallv, overlapped with the local
 * matrices; none when every matrix of the group is whole in one shard), the owners run
 * Newton-Schulz, scale by 0.2·sqrt(max(rows, cols)) (Moonlight's AdamW-RMS match) and return
 * the updates in one more; p ← p − lr·(update + wd·p). Counts and offsets are int64: a message
 * or offset past rt_muon_msg_limit (INT_MAX) goes as MPI_Ialltoallw with derived datatypes.
 * Bitwise the same update as on one rank. work: rt_muon_group_work values; counts:
 * rt_muon_counts_bytes(ranks) bytes. st (or NULL) accumulates what moved. Collective over comm. */
void rt_muon_group(MPI_Comm comm, int ranks, real *param, float *mom, const real *grad, const RtTensor *t, int nt,
                   int g, int64_t S, float grad_scale, const RtMuon *h, real *work, void *counts, RtMuonStats *st);
/* The same for the ng groups gs of one communicator at once: every moving matrix of all of
 * them goes to its owner in one all-to-all and comes back in one more (the program's dense
 * groups: one gather and one return per step, not one per layer). Bitwise the same updates as
 * one group at a time. work: rt_muon_groups_work values. */
void rt_muon_groups(MPI_Comm comm, int ranks, const RtMuonShard *gs, int ng, const RtTensor *t, int nt,
                    float grad_scale, const RtMuon *h, real *work, void *counts, RtMuonStats *st);
/* The scratch rt_muon_group needs on any rank of group g: S (what it sends) + the most any rank
 * owns of the moving matrices + 2·n + Newton-Schulz's work of the largest matrix. */
size_t rt_muon_group_work(const RtTensor *t, int nt, int g, int64_t S, int ranks);
/* rt_muon_groups': the sum of the shards + the most any rank owns of all the groups' moving
 * matrices + 2·n + Newton-Schulz's work of the largest (compiler/muon_work.c's figure). */
size_t rt_muon_groups_work(const RtTensor *t, int nt, const RtMuonShard *gs, int ng, int ranks);
/* The scratch rt_muon_exchange_start and _finish use on any rank for the ng groups gs: the most
 * any rank sends (its pieces of the moving matrices) + receives (the pieces of those it owns);
 * 0 when no matrix moves. No assembled matrix: the caller orthogonalizes in the pieces. */
size_t rt_muon_exchange_work(const RtTensor *t, int nt, const RtMuonShard *gs, int ng, int ranks);
/* Bytes of the counts scratch of rt_muon_group and rt_muon_exchange_start over ranks ranks:
 * int64 counts, offsets and fill positions (5 per rank), MPI's int ones (4) and the large
 * path's datatypes (2). */
size_t rt_muon_counts_bytes(int ranks);
/* Values per message above which the exchange uses derived datatypes (and the chunk of those):
 * INT_MAX; tests lower it to run that path on small groups. */
extern int64_t rt_muon_msg_limit;

/* Orthogonalizes one gathered Muon matrix for rt_muon_exchange_finish, in place: the matrix
 * (rows, cols, row-major, host) is the concatenation of its np pieces piece[i] of len[i] values
 * (some empty), and becomes the Newton-Schulz result of itself scaled by
 * 0.2·sqrt(max(rows, cols)). The callback may defer the work (queue it on a device) as long as
 * every piece holds its result when finish's done callback returns; ctx is the caller's. */
typedef void (*RtMuonOrth)(real *const *piece, const int64_t *len, int np, int rows, int cols, void *ctx);
/* An exchange in flight (rt_muon_exchange_start to rt_muon_exchange_finish). */
typedef struct {
  MPI_Comm comm;
  int ranks, me;
  const RtMuonShard *gs;
  int ng;
  const RtTensor *t;
  int nt;
  real *work;
  void *counts;
  int64_t sent, owned, most; /* values sent, received; the largest moving matrix */
  MPI_Request req;
  bool big;                  /* the derived-datatype path */
} RtMuonXchg;
/* The exchange half of rt_muon_groups for a backend that computes the momentum and updates
 * elsewhere (the cuda backend), split so that the caller overlaps the gather with its own work
 * (the experts' Newton-Schulz on the GPU), for the ng groups gs of one communicator. Each
 * group's nest (S values, host) holds this rank's Nesterov gradients at shard indices. start
 * sends the pieces of the matrices that no one shard holds whole to their owners (one
 * all-to-all, not waited for); finish waits, calls orth on each matrix this rank owns (in the
 * received pieces, in place), then done (or none: NULL) once, and returns the updates in one more all-to-all into each nest at the same indices (the pieces of
 * matrices held whole, and the values of other tensors, are left as they are). work:
 * rt_muon_exchange_work values (host); counts: rt_muon_counts_bytes(ranks) bytes; gs, the nests,
 * work and counts stay untouched until finish. start returns false, with nothing sent and no
 * finish to call, when every Muon matrix of the groups lies whole in one shard (the same answer
 * on every rank). Collective over comm. */
bool rt_muon_exchange_start(MPI_Comm comm, int ranks, const RtMuonShard *gs, int ng, const RtTensor *t, int nt,
                            real *work, void *counts, RtMuonXchg *xs);
void rt_muon_exchange_finish(RtMuonXchg *xs, RtMuonOrth orth, void (*done)(void *ctx), void *ctx, RtMuonStats *st);

/* Sets shard (n = hi - lo elements: gathered indices [lo, hi) of group g) to the initial
 * values of the tensors there; padding is 0. Every value is a function of (seed, tensor name,
 * expert index, element index) only, so any layout starts from the same model. */
void rt_init_shard(real *shard, const RtTensor *t, int nt, int g, int64_t lo, int64_t hi,
                   int ep_rank, uint64_t seed);
/* One AdamW step on the shard [lo, hi) of group g, for every tensor not optimized by Muon:
 * weight decay only inside tensors with decay set. grad_scale multiplies every gradient
 * (clipping). param, m and grad are indexed by position in the shard; v is compacted (RtGroup's
 * adam_v: the AdamW pieces' values one after another). */
void rt_adamw_shard(real *param, float *m, float *v, const real *grad, const RtTensor *t, int nt,
                    int g, int64_t lo, int64_t hi, float grad_scale, const RtAdamW *h);
/* The bytes the cost model counts for the optimizer step on the shard [lo, hi) of group g
 * (compiler/cost.c): 30 B per AdamW parameter (master, gradient and two moments read, written
 * back with the bf16 copy), 22 B per Muon parameter. `train --profile`'s optimizer class. */
double rt_opt_bytes(const RtTensor *t, int nt, int g, int64_t lo, int64_t hi);
/* The element value of tensor name (expert e, or -1) at index i, for tests and checkpoints. */
real rt_init_value(const char *name, int expert, int64_t i, float std, bool one, uint64_t seed);

/* What the generated step functions work on: the comm groups, the state arena and the HBM span
 * (every buffer at the offset step.c's maps give: its plan item's bytes), the token exchange's
 * counts, and per micro-batch scalars. */
typedef struct {
  RtComm comm;
  real *state;    /* master shards, gradient shards, moments (STATE_ELEMS; HBM or pinned host) */
  act *acts;      /* the HBM span: every other device buffer, activations, gathered parameters and
                     gradients, fp32 and int32 workspace (ACT_ELEMS units of the activation type) */
  act *host;      /* the host arena (activation offload; HOST_ELEMS activations), or NULL */
  act *wd, *we;  /* the gathered dense and expert parameters of the layer computing now (one of
                     two buffers each: the other receives the next layer's, prefetched) */
  act *dwd, *dwe; /* their gradients in the backward, in the activation type (GRAD0 or GRAD1:
                     the other's reduce-scatter is in flight) */
  RtA2A a2a;      /* MoE all-to-all counts (ep > 1) */
  RtHier hier;    /* the hierarchical all-to-all's communicators and tables (MOE_HIER_G > 0) */
  bool gather_kept; /* this micro-batch's forward gathers the groups the plan keeps gathered
                       until the optimizer step (reshard after_step: KEPT, DENSE_KEPT or
                       EXPERTS_KEPT): true for the first micro-batch of a step, false for the rest */
  real dloss;     /* weight of this micro-batch's loss in the step's objective: 1 / (accum × world) */
  double aux_loss;/* load-balancing loss added by the forward (summed over MoE layers) */
  double moe_load;       /* this step so far: the most rows an EP rank received in one MoE layer
                            pass / the mean (tokens × top_k); 0 without expert parallelism */
  long moe_extra_rounds; /* this step so far: all-to-all rounds past the first, over MoE layer
                            passes of the forward */
} RtCtx;

/* After a forward's rt_moe_route: folds its busiest rank's load and extra rounds into c's step
 * figures (moe_load, moe_extra_rounds). */
void rt_moe_note(RtCtx *c);

/* Activation offload (the plan's checkpoint.offload: host): boundary id's n values go from
 * the arena (dev) to the host arena and back. The cpu backend copies at once; the cuda backend
 * copies on a device-to-host and a host-to-device stream, after the compute stream reaches the
 * call, and rt_offload_wait makes the compute stream wait for the last copy of id (the host
 * does not block). ids < OFFLOAD_IDS; rt_offload_init sizes them (0 on success, -1). */
int rt_offload_init(int ids);
void rt_offload_store(RtCtx *c, int id, act *host, const act *dev, size_t n);
void rt_offload_load(RtCtx *c, int id, act *dev, const act *host, size_t n);
void rt_offload_wait(RtCtx *c, int id);

/* Saves the training state after `step` optimizer steps into dir/step-NNNNNNNN (format in
 * mtrt_ckpt.h): collective over the world; replica 0's ranks write their shards, rank 0 the
 * manifest, last. A complete checkpoint already at dir/step-NNNNNNNN is kept as it is (0). On a
 * failure every rank removes what it wrote (temporary, shard; rank 0 the step directory if
 * empty) and returns -1 (err names the file and why). kill_halfway (tests only): rank 0 kills
 * itself with SIGKILL after the shards are written and before the manifest. run: the run's
 * settings besides the model ("key value, ..."), kept in the manifest for rt_ckpt_load. model_keys:
 * the model section's keys as resolved (step.h MODEL_KEYS, "key value, ..."), kept in the manifest
 * for rt_ckpt_load's note and mtc export's comparison. */
int rt_ckpt_save(const char *dir, int64_t step, uint64_t seed, const RtComm *c, const real *state, const RtGroup *g,
                 int ng, const RtTensor *t, int nt, int El, const char *model, const char *model_keys,
                 const char *optimizer, const char *run, bool kill_halfway, char *err, size_t errlen);
/* Loads checkpoint directory path (saved under any layout) into this rank's master shards and
 * optimizer moments (in state, the state arena on the host; a group without a second moment
 * skips the checkpoint's); sets *step and *seed. Refuses a checkpoint of another model (the
 * manifest's model is not this program's model name), of another optimizer, or one whose tensors differ from the program's: one missing on either side (a checkpoint with more
 * layers than the program is not cut), or of another shape or number of experts; err names the
 * tensor, both shapes and what to do. Collective; -1 on every rank if
 * any failed (a corrupt or truncated shard is named in err). note (notelen bytes): which of this
 * run's settings (run) differ from the checkpoint's (rt_ckpt_run_diff), then which of the model's
 * keys (model_keys: conventions such as rope_theta, as the shapes are equal) differ from the
 * checkpoint's model_keys where it records them; empty when none does; run_id: set to the
 * checkpoint's run id (unchanged when it records none). */
int rt_ckpt_load(const char *path, int64_t *step, uint64_t *seed, const RtComm *c, real *state, const RtGroup *g,
                 int ng, const RtTensor *t, int nt, const char *model, const char *model_keys, const char *optimizer,
                 const char *run, char run_id[RT_RUN_ID_LEN + 1], char *note, size_t notelen, char *err,
                 size_t errlen);

/* The process's peak resident memory so far (VmHWM of /proc/self/status), bytes; -1 where
 * the kernel does not report it. */
int64_t rt_peak_rss_bytes(void);
/* Writes a zero into every 4 KiB page of p (bytes long, zeroed memory such as calloc's), so
 * that the pages are resident now: memory that is not there fails at start-up, not mid-step. */
void rt_prefault(void *p, size_t bytes);
/* Seconds from a monotonic clock. */
double rt_now(void);
/* Draws a new run id (mtrt_ckpt.h's RT_RUN_ID_LEN) into id: getrandom, or the clock and pid where
 * the kernel has no entropy yet. */
void rt_run_id_new(char id[RT_RUN_ID_LEN + 1]);
/* The start-up check that the program is its directory's: DIR/plan.json, DIR being the directory
 * above the executable's (DIR/build/train, DIR/build-cuda/train), hashes (FNV-1a 64 of its bytes,
 * as mtc build's out_hash_file) to plan_hash (step.h's PLAN_HASH). 0 when it does, or when there
 * is no plan.json there (a program copied away from its directory); -1 with err saying which
 * plan each is and what to run (mtc build DIR for a stale program) otherwise. */
int rt_program_plan_check(const char *plan_hash, char *err, size_t errlen);

/* The figures of one optimizer step, as a metrics line reports them. */
typedef struct {
  int64_t step;          /* 1-based (64-bit: training.steps allows 2^40) */
  double loss, aux_loss, lr, grad_norm;
  int skipped;           /* the step was not finite: no update */
  double moe_load;       /* with expert parallelism: the busiest EP rank's rows over the mean in the
                            step's worst MoE layer pass; < 0 without (the key is left out) */
  int64_t moe_extra_rounds; /* the all-to-all rounds past the first (buffers of moe_imbalance x the mean) */
  double time;             /* when the step ended: seconds since the Unix epoch (CLOCK_REALTIME) */
  double step_seconds;     /* the step's wall time, from its first micro-batch to its update */
  double tokens_per_second; /* the step's tokens (all ranks) over step_seconds */
  const char *run;         /* the run id (RT_RUN_ID_LEN hex digits) */
} RtStepMetrics;

/* One metrics line as JSON in b (n bytes), '\n' included (non-finite numbers as null;
 * "skipped":true on a skipped step): {"step":1,"loss":5.54,...}. The figures that are the same
 * in two runs of one program come first, then the ones that are not ("time", "step_seconds",
 * "tokens_per_second", "run"): a comparison of two runs cuts each line at ,"time". Returns its
 * length, or -1 when it does not fit. */
int rt_metrics_line(char *b, size_t n, const RtStepMetrics *s);

/* The metrics file of a run (rank 0's): path, its descriptor (opened O_APPEND) and its length;
 * replaced: the bytes of lines it was emptied of (an earlier run's, or on a resume a file that
 * did not end at the checkpoint's step or whose last line is another run's); last_step: on such
 * a resume, the step of the last line it held (-1 when that line had none); last_run: that
 * line's run id when it was another run's (else ""). */
typedef struct {
  const char *path;
  int fd;
  int64_t bytes, replaced, last_step;
  char last_run[RT_RUN_ID_LEN + 1];
} RtMetrics;

/* Opens path for appending (created if missing): a regular file, or a character device such as
 * /dev/null; a FIFO, a directory, a socket, a symbolic link to nothing (which open would
 * create wherever it points), a file of a kernel pseudo file system (/proc, /sys) and a file
 * another run holds (each run flocks its regular file until it ends) are refused. A new run (resume_step < 0) empties a regular file (its
 * lines are an earlier run's; m->replaced says how many bytes); a resumed run (from the
 * checkpoint of step resume_step) drops a cut last line (a killed run's) and the last lines
 * whose step is past it, up to the first that is not; when the line left last is not of step
 * resume_step, or carries a run id other than run_id (another run's line, which a line of an
 * older mtc without "run" is not taken to be), it empties the file (m->replaced, m->last_step,
 * m->last_run). 0, or -1 with "PATH: why; expected ..." in err. */
int rt_metrics_open(RtMetrics *m, const char *path, int64_t resume_step, const char *run_id, char *err,
                    size_t errlen);
/* Appends the line of s with one write(): it is in the file (the kernel's page cache) when this
 * returns 0. A failed or short write (disk full) removes what part of the line was written and
 * returns -1 with "PATH: No space left on device (writing step N); expected ..." in err. */
int rt_metrics_write(RtMetrics *m, const RtStepMetrics *s, char *err, size_t errlen);
/* Closes the file: 0, or -1 with err set when the close reports a write error. */
int rt_metrics_close(RtMetrics *m, char *err, size_t errlen);

#endif
