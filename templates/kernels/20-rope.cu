// ==== templates/kernels/20-rope.cu: rotary position embeddings (plain, YaRN, Llama 3.1) ====

// RoPE (Su et al. 2021), half-split pairs (i, i + HEAD_DIM/2), in place on x (TOKENS, heads,
// HEAD_DIM), tokens ld elements apart (heads × HEAD_DIM, or a fused q | k | v row's width: its
// first heads are q's and k's); sign -1 rotates back (the backward). grid TOKENS, block heads × HEAD_DIM/2.
extern "C" __global__ void rope(act *x, int heads, int ld, float sign) {
  int t = blockIdx.x, pos = t % SEQ_LEN;
  for (int k = threadIdx.x; k < heads * (HEAD_DIM / 2); k += blockDim.x) {
    int h = k / (HEAD_DIM / 2), i = k % (HEAD_DIM / 2);
    // the angle in double: at positions in the tens of thousands, fast-math float powf/sinf
    // would be off by 1e-3 rad (double is untouched by --use_fast_math)
    double sd, cd;
    sincos((double)pos * exp2(-2.0 * i / HEAD_DIM * log2((double)ROPE_THETA)), &sd, &cd);
    float c = (float)cd, s = sign * (float)sd;
    act *p = x + (size_t)t * ld + h * HEAD_DIM;
    float a = f32(p[i]), b = f32(p[i + HEAD_DIM / 2]);
    p[i] = to_act(a * c - b * s);
    p[i + HEAD_DIM / 2] = to_act(a * s + b * c);
  }
}

// RoPE with YaRN (model.rope_scaling type yarn; the cpu's rt_rope_yarn_*): pair i's inverse
// frequency blends θ^(−2i/HEAD_DIM) and it / factor by a ramp between pairs lo and hi (computed
// by the host as transformers does), and the rotation is scaled by attn. sign −1 with the same
// attn is the backward (the transposed map). grid TOKENS, block heads × HEAD_DIM/2.
extern "C" __global__ void rope_yarn(act *x, int heads, float sign, float factor, float lo, float hi, float attn) {
  int t = blockIdx.x, pos = t % SEQ_LEN;
  for (int k = threadIdx.x; k < heads * (HEAD_DIM / 2); k += blockDim.x) {
    int h = k / (HEAD_DIM / 2), i = k % (HEAD_DIM / 2);
    double f = exp2(-2.0 * i / HEAD_DIM * log2((double)ROPE_THETA));
    double ramp = ((double)i - lo) / ((double)hi - lo);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    f = f / factor * ramp + f * (1 - ramp);
    double sd, cd;
    sincos((double)pos * f, &sd, &cd);
    float c = attn * (float)cd, s = sign * attn * (float)sd;
    act *p = x + ((size_t)t * heads + h) * HEAD_DIM;
    float a = f32(p[i]), b = f32(p[i + HEAD_DIM / 2]);
    p[i] = to_act(a * c - b * s);
    p[i + HEAD_DIM / 2] = to_act(a * s + b * c);
  }
}

// RoPE with Llama 3.1's frequency scaling (model.rope_scaling type llama3; the cpu's
// rt_rope_llama3_*): inverse frequency f = θ^(−2i/HEAD_DIM) of wavelength λ = 2π/f is kept where
// λ < orig/high, divided by factor where λ > orig/low, and blended by s = (orig/λ − low)/(high −
// low) between. Angles in double, as rope's. Tokens ld elements apart, as rope's. grid TOKENS,
// block heads × HEAD_DIM/2.
extern "C" __global__ void rope_llama3(act *x, int heads, int ld, float sign, float factor, float low, float high,
                                       float orig) {
  int t = blockIdx.x, pos = t % SEQ_LEN;
  for (int k = threadIdx.x; k < heads * (HEAD_DIM / 2); k += blockDim.x) {
    int h = k / (HEAD_DIM / 2), i = k % (HEAD_DIM / 2);
    double f = exp2(-2.0 * i / HEAD_DIM * log2((double)ROPE_THETA)), wavelen = 2 * 3.14159265358979323846 / f;
    if (wavelen > (double)orig / low) {
      f /= factor;
    } else if (wavelen >= (double)orig / high) {
      double s = ((double)orig / wavelen - low) / ((double)high - low);
      f = (1 - s) * f / factor + s * f;
    }
    double sd, cd;
    sincos((double)pos * f, &sd, &cd);
    float c = (float)cd, s = sign * (float)sd;
    act *p = x + (size_t)t * ld + h * HEAD_DIM;
    float a = f32(p[i]), b = f32(p[i + HEAD_DIM / 2]);
    p[i] = to_act(a * c - b * s);
    p[i + HEAD_DIM / 2] = to_act(a * s + b * c);
  }
}

