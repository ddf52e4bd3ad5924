// emu_bridge.h — what fake_cuda.cpp lends the other fakes (fake_cudnn.cpp): stream order, the
// reports, device-memory checks and bf16 conversions, with fake_cuda.cpp's behaviour (EMU_STREAMS,
// EMU_STRICT, EMU_TRACE).
#pragma once
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include <functional>

// Runs op on stream s as fake_cuda.cpp runs a cuBLAS call: at once, or queued (EMU_STREAMS=lazy).
void emu_issue(cudaStream_t s, const char *name, std::function<void()> op);
void emu_count_cudnn(void);             // one cuDNN plan executed (EMU_COUNTS)
void emu_report_error(const char *msg); // "cuda-emu: ERROR: msg"; aborts under EMU_STRICT
void emu_report_trace(const char *msg); // printed with EMU_TRACE=1
bool emu_tracing(void);
// bytes at p must lie in one device allocation (else an error naming what)
void emu_check_device(const void *p, size_t bytes, const char *what);
float emu_from_bf16(uint16_t h);
uint16_t emu_to_bf16(float f);
float emu_round_bf16(float f);
