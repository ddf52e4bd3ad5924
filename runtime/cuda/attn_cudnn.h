/*
 * attn_cudnn.h — causal attention through cuDNN's fused flash attention (attn_cudnn.c): one shape
 * with strided views, forward and backward on the runtime's stream, device pointers, bf16 (the
 * runtime's bf16-activation build). Shared by ops.c and the tests; no CUDA header needed.
 */
#ifndef ATTN_CUDNN_H
#define ATTN_CUDNN_H

#include <stddef.h>
#include <stdint.h>

/* Strides of one strided view (elements): between sequences, heads and tokens; the head dim is contiguous. */
typedef struct {
  int64_t batch, head, token;
} CuAttnView;
/* One attention shape: b sequences, hq query and hkv KV heads (hq a multiple of hkv), s_q queries
 * that are the last s_q of s_kv keys (s_q <= s_kv), head dims dqk (q, k) and dv (v, o); the views
 * of q, k, v and o (dO as o, dQ as q, dK as k, dV as v). Compared bytewise: memset before filling. */
typedef struct {
  int64_t b, hq, hkv, sq, skv, dqk, dv;
  CuAttnView q, k, v, o;
} CuAttnShape;
/* Checks cuDNN's version (>= 9.13; 9.10.0 and 9.10.1 by name) and creates its handle on the
 * stream; 0, or -1 with the reason and what to install in err. */
int cu_attn_cudnn_init(char *err, size_t errlen);
void cu_attn_cudnn_teardown(void);
/* Builds (once) the forward and backward plans of shape a; a shape cuDNN cannot serve, or whose
 * engine's workspace exceeds cu_attn_workspace_bytes, aborts the job naming the shape and bytes. */
void cu_attn_cudnn_prepare(const CuAttnShape *a);
/* The engines chosen so far, one line ("fwd engine 8 (0 B workspace), bwd ..."). */
const char *cu_attn_cudnn_report(void);
/* out (o view) and lse (b × hq × s_q fp32, the rows' natural-log log-sum-exp of the scaled scores)
 * of causal softmax(q kᵀ / sqrt(dqk)) v; device pointers, bf16 views, on the stream. */
void cu_attn_cudnn_forward(const CuAttnShape *a, void *out, float *lse, const void *q, const void *k, const void *v);
/* dq, dk, dv (written, not accumulated) from dout, the forward's inputs, out and lse; delta
 * (b × hq × s_q fp32) and dqacc (b × hq × s_q × dqk fp32) are scratch. */
void cu_attn_cudnn_backward(const CuAttnShape *a, void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const void *out, const float *lse, float *delta,
                            float *dqacc);
#endif
