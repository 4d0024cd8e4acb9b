#version 450
// proj/shaders/gemm: the Vulkan backend's one product (proj/vulkan.c), compiled once per resident
// weight type (-DTYPE_F32, -DTYPE_Q8_0, ...) by glslc at build time.
//
//   Y[t][yoff + o] (+)= sum over i of X[t][xoff + i] * E(o, i)
//
// with E the effective weight of this dispatch's part of W (whole rows of the N x K row-major
// weight, as GGUF stores it): FWD (dir 0) E(o, i) = W[o][i] (o a row of the part, i < K); BWD
// (dir 1) E(o, i) = W[i][o] (i a row of the part, o < K). The same bytes serve both directions:
// only the roles of the indices swap.
//
// Layout: a work group of 16 x 8 invocations computes a tile of 32 rows x 64 outputs, each
// invocation 4 rows x 4 outputs in registers; the reduction runs in steps of 32 through shared
// memory, X's tile and W's tile both staged there, W dequantized on its way in ("dequantize in
// load"): every weight element is decoded once per tile, by its own type's arithmetic, the
// same operations in the same order as model/quant.c's to_float (so one-hot rows give the CPU's
// values bit for bit). Each output is one invocation's sum over i ascending, one product added
// at a time, FP32, no atomics: the same bits run to run, whatever T, whatever the tile a row
// falls in, and whatever the split into parts (a later part starts from the stored partial sum).
#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = 16, local_size_y = 8, local_size_z = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer WBuf { uint wq[]; };
layout(std430, set = 0, binding = 1) readonly buffer XBuf { uint xs[]; }; // FP32, or FP16 pairs (xh)
layout(std430, set = 0, binding = 2) buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint T;      // rows of X and Y in this dispatch
    uint I;      // reduction length (FWD: K; BWD: the part's rows)
    uint O;      // outputs per row (FWD: the part's rows; BWD: K)
    uint ldx;    // X row stride in floats
    uint ldy;    // Y row stride in floats
    uint xoff;   // first X column (BWD: the part's first row of W)
    uint yoff;   // first Y column (FWD: the part's first row of W)
    uint rowb;   // bytes of one W row
    uint dir;    // 0 FWD, 1 BWD
    uint accum;  // 1: start from Y's stored value (a BWD part after the first)
    uint xh;     // 1: X holds FP16 values, two a word (the FP16 wire), else FP32
} pc;

#define BT 32
#define BO 64
#define BI 32

shared float Xs[BT][BI + 1];
shared float Ws[BO][BI + 1];

uint rd8(uint b) { return (wq[b >> 2] >> ((b & 3u) * 8u)) & 0xffu; }
uint rd16(uint b) { return (wq[b >> 2] >> ((b & 2u) * 8u)) & 0xffffu; } // b even
int sx8(uint v) { return int(v << 24) >> 24; }

// IEEE half -> float, as nl_f16_to_f32 (subnormals exact, no reliance on the driver's own
// conversion or its denormal mode)
float f16(uint h) {
    uint sgn = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return uintBitsToFloat(sgn | 0x7f800000u | (m << 13));
    if (e == 0u) {
        precise float v = float(m) * (1.0 / 16777216.0);
        return sgn != 0u ? -v : v;
    }
    return uintBitsToFloat(sgn | ((e + 112u) << 23) | (m << 13));
}

// element c of row r of this part's W
float wel(uint r, uint c) {
    uint base = r * pc.rowb;
#if defined(TYPE_F32)
    return uintBitsToFloat(wq[(base >> 2) + c]);
#elif defined(TYPE_F16)
    return f16(rd16(base + 2u * c));
#elif defined(TYPE_BF16)
    return uintBitsToFloat(rd16(base + 2u * c) << 16);
#elif defined(TYPE_Q8_0)
    uint blk = base + (c >> 5) * 34u;
    precise float v = float(sx8(rd8(blk + 2u + (c & 31u)))) * f16(rd16(blk));
    return v;
#elif defined(TYPE_Q4_0)
    uint blk = base + (c >> 5) * 18u, j = c & 31u;
    uint q = j < 16u ? rd8(blk + 2u + j) & 15u : rd8(blk + 2u + j - 16u) >> 4;
    precise float v = float(int(q) - 8) * f16(rd16(blk));
    return v;
#elif defined(TYPE_Q4_1)
    uint blk = base + (c >> 5) * 20u, j = c & 31u;
    uint q = j < 16u ? rd8(blk + 4u + j) & 15u : rd8(blk + 4u + j - 16u) >> 4;
    precise float v = float(q) * f16(rd16(blk)) + f16(rd16(blk + 2u));
    return v;
#elif defined(TYPE_Q5_0)
    uint blk = base + (c >> 5) * 22u, j = c & 31u;
    uint qh = rd16(blk + 2u) | (rd16(blk + 4u) << 16);
    int x = j < 16u ? int((rd8(blk + 6u + j) & 15u) | (((qh >> j) << 4) & 16u))
                    : int((rd8(blk + 6u + j - 16u) >> 4) | ((qh >> (j - 16u + 12u)) & 16u));
    precise float v = float(x - 16) * f16(rd16(blk));
    return v;
#elif defined(TYPE_Q4_K)
    uint blk = base + (c >> 8) * 144u, e = c & 255u;
    uint is = e >> 5, l = e & 31u, sc, mn;
    if (is < 4u) {
        sc = rd8(blk + 4u + is) & 63u;
        mn = rd8(blk + 8u + is) & 63u;
    } else {
        sc = (rd8(blk + 8u + is) & 15u) | ((rd8(blk + is) >> 6) << 4);
        mn = (rd8(blk + 8u + is) >> 4) | ((rd8(blk + 4u + is) >> 6) << 4);
    }
    uint qb = rd8(blk + 16u + 32u * (is >> 1) + l);
    uint q = (is & 1u) != 0u ? qb >> 4 : qb & 15u;
    precise float d1 = f16(rd16(blk)) * float(sc);
    precise float m1 = f16(rd16(blk + 2u)) * float(mn);
    precise float v = d1 * float(q) - m1;
    return v;
#elif defined(TYPE_Q6_K)
    uint blk = base + (c >> 8) * 210u, e = c & 255u;
    uint h = e >> 7, rr = e & 127u, qd = rr >> 5, l = rr & 31u;
    uint ql = blk + 64u * h, qh = blk + 128u + 32u * h, scb = blk + 192u + 8u * h;
    uint lo = rd8(ql + l + ((qd & 1u) != 0u ? 32u : 0u));
    lo = qd >= 2u ? lo >> 4 : lo & 15u;
    uint hi = (rd8(qh + l) >> (2u * qd)) & 3u;
    int q = int(lo | (hi << 4)) - 32;
    int s = sx8(rd8(scb + (l >> 4) + 2u * qd));
    precise float v = f16(rd16(blk + 208u)) * float(s) * float(q);
    return v;
#else
#error "no TYPE_ defined"
#endif
}

void main() {
    const uint lx = gl_LocalInvocationID.x, ly = gl_LocalInvocationID.y;
    const uint tid = ly * 16u + lx;
    const uint o0 = gl_WorkGroupID.x * BO, t0 = gl_WorkGroupID.y * BT;

    float acc[4][4];
    [[unroll]] for (uint a = 0u; a < 4u; a++)
        [[unroll]] for (uint b = 0u; b < 4u; b++) {
            const uint t = t0 + ly + 8u * a, o = o0 + lx + 16u * b;
            acc[a][b] = pc.accum != 0u && t < pc.T && o < pc.O ? ys[t * pc.ldy + pc.yoff + o] : 0.0;
        }

    for (uint i0 = 0u; i0 < pc.I; i0 += BI) {
        const uint n = min(uint(BI), pc.I - i0);
        // X tile: 32 x 32, 8 per invocation, along the row
        [[unroll]] for (uint r = 0u; r < 8u; r++) {
            const uint idx = tid + 128u * r, tt = idx >> 5, ii = idx & 31u;
            const uint t = t0 + tt;
            float xv = 0.0;
            if (t < pc.T && ii < n) {
                const uint e = t * pc.ldx + pc.xoff + i0 + ii;
                xv = pc.xh != 0u ? f16((xs[e >> 1] >> ((e & 1u) * 16u)) & 0xffffu) : uintBitsToFloat(xs[e]);
            }
            Xs[tt][ii] = xv;
        }
        // W tile: 64 x 32, 16 per invocation, neighbouring invocations on neighbouring bytes
        // of one W row (FWD: along i; BWD: along o)
        [[unroll]] for (uint r = 0u; r < 16u; r++) {
            const uint idx = tid + 128u * r;
            uint oo, ii;
            if (pc.dir == 0u) { oo = idx >> 5; ii = idx & 31u; }
            else { oo = idx & 63u; ii = idx >> 6; }
            const uint o = o0 + oo, i = i0 + ii;
            float v = 0.0;
            if (o < pc.O && ii < n) v = pc.dir == 0u ? wel(o, i) : wel(i, o);
            Ws[oo][ii] = v;
        }
        barrier();
        for (uint k = 0u; k < n; k++) {
            float xv[4], wv[4];
            [[unroll]] for (uint a = 0u; a < 4u; a++) xv[a] = Xs[ly + 8u * a][k];
            [[unroll]] for (uint b = 0u; b < 4u; b++) wv[b] = Ws[lx + 16u * b][k];
            [[unroll]] for (uint a = 0u; a < 4u; a++)
                [[unroll]] for (uint b = 0u; b < 4u; b++) {
                    precise float p = xv[a] * wv[b];
                    acc[a][b] = acc[a][b] + p;
                }
        }
        barrier();
    }

    [[unroll]] for (uint a = 0u; a < 4u; a++)
        [[unroll]] for (uint b = 0u; b < 4u; b++) {
            const uint t = t0 + ly + 8u * a, o = o0 + lx + 16u * b;
            if (t < pc.T && o < pc.O) ys[t * pc.ldy + pc.yoff + o] = acc[a][b];
        }
}
