/*
 * mtrt_ckpt.h — checkpoints of the whole training state: one shard file per FSDP rank of
 * replica 0 (the other replicas hold the same state) plus a manifest, in DIR/step-NNNNNNNN/.
 *
 *   rank-NNNNN.bin   header (256 bytes: magic "MTCCKPT1", then little-endian int64 fields:
 *                    version 1, step, fsdp rank, fsdp, ep, dp_replicate, bytes per master value,
 *                    number of groups), then per group in table order: the fp32 (or double)
 *                    master shard, the first and the second optimizer moment (fp32)
 *   manifest.json    format, model, optimizer, step, seed, layout, groups (name, comm, full, shard),
 *                    tensors (name, group, offset, count, experts, rows, cols; routed tensors in
 *                    whole-expert shards also per and block: the shard layout), per shard
 *                    file its size and FNV-1a 64 checksum, and manifest_fnv1a64: FNV-1a 64 of
 *                    every other field (rt_ckpt_manifest_sum), so that no field is edited unseen;
 *                    run: the settings besides the model that shape what is trained and in
 *                    which order, compared on resume (rt_ckpt_run_diff); model_keys: the
 *                    model section's keys as resolved (mtc's spec_model_keys), compared by
 *                    mtc export with the spec it writes config.json from, noted on resume
 *
 * A checkpoint is complete once its manifest exists: shards are written to a temporary name,
 * fsync'ed and renamed, then rank 0 writes the manifest the same way, last. A process killed
 * mid-save leaves a step directory without a manifest, which loading skips. A save that fails
 * removes its temporaries, the shards it wrote and its step directory; a step directory that
 * already holds a complete checkpoint is never rewritten.
 *
 * Loading reads any layout: every element of every tensor is found by name, expert index and
 * position, so a checkpoint saved with one world size, fsdp or ep resumes under another.
 * This reader needs no MPI (mtc export uses it).
 */
#ifndef MTRT_CKPT_H
#define MTRT_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { RT_CKPT_HEADER = 256 };

typedef struct {
  char *name;
  int comm; /* 0 FSDP group, 1 expert-shard group */
  int64_t full, shard;
} RtCkptGroup;

typedef struct {
  char *name; /* routed: a pattern with %d */
  int group, experts;
  int64_t offset, count, rows, cols;
  int per;       /* whole-expert shards: experts per shard, expert k at offset + (k / per)·block +
                    (k % per)·count; 0 (flat, and every checkpoint before them): offset + k·count */
  int64_t block; /* the group's shard size when per > 0 */
} RtCkptTensor;

/* A parsed manifest and the open shard files of one checkpoint. */
typedef struct {
  char *dir;       /* DIR/step-NNNNNNNN (allocated) */
  char model[128];
  char optimizer[16]; /* "adamw" or "muon": what the moments are */
  int64_t step;
  uint64_t seed;
  char *run;       /* the run's settings ("key value, key value, ..."; allocated), or NULL */
  char *model_keys; /* the model section's keys as resolved ("model.layers 4, ..."; allocated), or NULL
                       (a checkpoint of an mtc before it recorded them) */
  int fsdp, ep, dp_replicate, experts_per_rank, real_bytes;
  RtCkptGroup *groups;
  int ngroups;
  RtCkptTensor *tensors;
  int ntensors;
  int nshards;
  int64_t *shard_bytes;
  uint64_t *shard_sum;
  int *fds;        /* shard files, opened and verified on first use (-1 until then) */
  bool *verified;
} RtCkpt;

/* FNV-1a 64 of n bytes, continuing from h (start with RT_FNV_SEED). */
#define RT_FNV_SEED 0xcbf29ce484222325ull
uint64_t rt_fnv1a(uint64_t h, const void *p, size_t n);

/* The checksum of a manifest (a json_t *): FNV-1a 64 of its compact JSON with sorted keys, less
 * its manifest_fnv1a64 field. */
uint64_t rt_ckpt_manifest_sum(const void *root);

/* A run's id: 16 lowercase hex digits (64 random bits). A new run draws one; a resumed run keeps
 * its checkpoint's (the manifest's run record holds it as "run_id ID", first), so every metrics
 * line of one run, across resumes, carries the same id and two runs in one file can be told
 * apart. */
#define RT_RUN_ID_LEN 16
/* Whether the n bytes at s are a run id (RT_RUN_ID_LEN lowercase hex digits). */
bool rt_run_id_valid(const char *s, size_t n);
/* The run id in a manifest's run record run ("run_id ID, ..."), into id; id unchanged when run
 * is NULL or holds none (a checkpoint of an mtc before run ids). */
void rt_ckpt_run_id(const char *run, char id[RT_RUN_ID_LEN + 1]);

/* The items ("key value", separated by ", ") of run in which saved differs (or that saved lacks),
 * as "key: V1 in the checkpoint, V2 now; ..." in out (n bytes; empty when they agree): what a
 * resume says before it goes on with this run's settings; run_id (which run, not how) is not
 * compared. saved NULL (a checkpoint without them): out says so and lists run. */
void rt_ckpt_run_diff(char *out, size_t n, const char *saved, const char *run);

/* The newest complete checkpoint under dir: returns its step (its directory is
 * dir/step-%08lld of it); 0 when there is none (or dir does not exist). */
int64_t rt_ckpt_latest(const char *dir);
/* The step of a checkpoint directory's name exactly as the trainer writes it ("step-%08lld":
 * 8 digits or more, no sign, nothing else), or -1 for any other name. */
long long rt_ckpt_step_of(const char *name);
/* Retention (train --keep-checkpoints): removes the complete checkpoints of mtc's under dir
 * older than the keep newest: a directory named step-%08lld (a real directory, never a symbolic
 * link) with a manifest.json of format mtc-checkpoint-1 (a regular file). Of each, only the
 * manifest, the shards it names (rank-NNNNN.bin, regular files) and their .tmp leftovers are
 * unlinked, and the directory when it is then empty; anything else there stays (err names it).
 * Incomplete directories (left by a killed save) and links stay. Returns how many it removed,
 * or -1 with err set (what it could remove is gone). */
/* Takes dir/lock (created if missing, flock'd exclusively) for this process's lifetime, so that a
 * second training run on the same checkpoint directory (a requeued job while the first still
 * runs) is refused instead of overwriting its shards. Returns the lock's descriptor (*created: the
 * file was made by this call), or -1 with err saying which run holds it. Rank 0. rt_ckpt_unlock_refused: a run refused at start-up leaves nothing behind: it
 * removes the lock file (remove_lock: it made it) and dir when empty (remove_dir: it made it). */
int rt_ckpt_lock(const char *dir, int *created, char *err, size_t errlen);
void rt_ckpt_unlock_refused(const char *dir, int fd, int remove_lock, int remove_dir);
/* Bytes to spare under the system's limit on a path (pathconf PATH_MAX) for the longest name a
 * save writes under checkpoint directory dir: negative when a save there could not name its
 * files, which the trainer refuses at start-up. */
long rt_ckpt_path_room(const char *dir);
/* Whether dir is a checkpoint's step directory: its name is step-N (rt_ckpt_step_of) or it holds
 * a manifest.json. rt_ckpt_step_dir_parent: then the directory that holds it (allocated), else
 * NULL. */
int rt_ckpt_is_step_dir(const char *dir);
char *rt_ckpt_step_dir_parent(const char *dir);
int rt_ckpt_prune(const char *dir, int keep, char *err, size_t errlen);
/* Removes what interrupted saves left under dir: a step-%08lld directory (real, never a link)
 * without manifest.json that holds only shard files (rank-NNNNN.bin) and .tmp files of them or
 * of the manifest. Such a checkpoint cannot be resumed from, and the run that finds it saves
 * that step again when it gets there. A directory holding anything else stays (err names it).
 * The names removed go to removed ("step-00000003, ..."). Returns how many were removed, or -1
 * with err set. No MPI: rank 0 calls it. */
int rt_ckpt_clean_incomplete(const char *dir, char *removed, size_t removedlen, char *err, size_t errlen);
/* Reads the manifest of checkpoint directory path (DIR/step-N) and checks every field: ranges,
 * the layout, each group's full = shard x ranks, each tensor inside its group with rows x cols =
 * count and a unique name (routed: one %d), each shard's size = the header + the groups'
 * sections, and the manifest's own checksum when it has one (the files' sizes, checksums and
 * headers are checked on first read). Returns 0, or
 * -1 with "MANIFEST: FIELD ...; expected ..." in err. */
int rt_ckpt_open(RtCkpt *k, const char *path, char *err, size_t errlen);
void rt_ckpt_close(RtCkpt *k);
/* The name of expert e of tensor t (its pattern's one %d replaced by e; a tensor not routed: its
 * name) in dst of n bytes, copied literally: a name is never a format. -1 when it does not fit. */
int rt_ckpt_name(char *dst, size_t n, const RtCkptTensor *t, int e);
/* Copies n elements starting at element `first` of tensor `name` (expert e, or -1) into dst
 * as double: master values (which 0), or the first (1) or second (2) optimizer moment. A shard
 * is checksummed before its first use: a mismatch, a short file or a missing tensor fails
 * (-1, err names the file). */
int rt_ckpt_read(RtCkpt *k, const char *name, int e, int64_t first, int64_t n, int which, double *dst,
                 char *err, size_t errlen);

/* Atomic replace of a file, shared by checkpoints and mtc export: write PATH.tmp, then rename
 * it over PATH. Only a regular file or a missing path is replaced; anything else (a device, a
 * FIFO, a directory, a socket, a symbolic link to anything) is refused before anything is
 * written: mtc never writes through a link (one into a checkpoint would replace a shard).
 * rt_replace_begin checks path and creates path.tmp (its name in *tmp, allocated: the caller frees it; a stale
 * regular file or symlink there is removed first) for writing: returns its descriptor, or -1
 * with "PATH: a character device; expected a regular file or a path that does not exist" in
 * err. rt_replace_commit checks path again and renames tmp over it: 0, or -1 with err set and
 * tmp removed. Neither closes or syncs the descriptor: the caller does, before commit. */
int rt_replace_begin(const char *path, char **tmp, char *err, size_t errlen);
int rt_replace_commit(const char *tmp, const char *path, char *err, size_t errlen);

/* Writes all n bytes of p to fd, retrying short writes and EINTR: 0, or -1 with errno set (a
 * write that makes no progress, as on a full disk, is -1 with errno ENOSPC). */
int rt_write_all(int fd, const void *p, size_t n);

/* A path built from fmt, allocated (the caller frees it): no path is cut to fit a buffer. Out of
 * memory exits with a message. */
char *rt_pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* What symbolic link path points to, allocated ("?" when it cannot be read). */
char *rt_link_target(const char *path);

#endif
