// cuBLASLt, emulated on the CPU: the descriptor / layout / preference / heuristic / matmul calls the
// backend makes (src/kernels/matmul.cu), with the checks the real library does and the ones a
// wrong call would only show on a GPU:
//   * every attribute set is one this emulator knows, with the size of its documented type; any
//     other attribute, compute type, scale type or epilogue is refused (CUBLAS_STATUS_NOT_SUPPORTED)
//     with a message, so a new use cannot silently do something else than on the GPU;
//   * layouts: column-major, ld >= rows, the shapes of op(A), op(B), C and D agree, one data type
//     (fp32 or bf16) for A, B, C, D and the bias;
//   * GELU_AUX epilogues: aux pointer set, AUX_LD >= m and divisible by 8 (the documented rule);
//   * alignment: the MIN_ALIGNMENT preferences are what the heuristic's algorithm relies on, so at
//     cublasLtMatmul every pointer (and ld in bytes) must really have that alignment, and the algo
//     must come from a heuristic call for this same problem;
//   * the memory it reads and writes is checked like any other stream work (emu_internal.h).
// The product: fp32 (OpenBLAS sgemm) on fp32 copies of the operands; bf16 operands are exact in
// fp32, the result is rounded to bf16 once (round to nearest even) after the epilogue.
#include <cblas.h>
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "emu_internal.h"

using namespace zt_emu;

namespace {

constexpr uint64_t kMagicDesc = 0x7a74656d75646573ull, kMagicLayout = 0x7a74656d756c6179ull,
                   kMagicPref = 0x7a74656d75707266ull, kMagicAlgo = 0x7a74656d75616c67ull;

struct Desc {
  uint64_t magic;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa, transb;
  uint32_t epilogue;
  int32_t bias_type;
  bool bias_type_set;
  const void* bias;
  void* aux;
  int64_t aux_ld;
};
struct Layout {
  uint64_t magic;
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Pref {
  uint64_t magic;
  uint64_t max_ws;
  uint32_t align[4];  // A B C D
};
struct Algo {  // lives in cublasLtMatmulAlgo_t::data
  uint64_t magic;
  uint64_t problem;  // hash of the problem the heuristic was asked for
  uint32_t align[4];
  uint32_t bias_align, aux_align;
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t), "Desc fits");
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "Layout fits");
static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "Pref fits");
static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t), "Algo fits");

cublasStatus_t refuse(cublasStatus_t st, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
cublasStatus_t refuse(cublasStatus_t st, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::fprintf(stderr, "zt-emu: cuBLASLt: ");
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
  va_end(ap);
  return st;
}

size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 0; }

uint32_t align_of(const void* p, int64_t ld, size_t es) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p) | uintptr_t(ld) * uintptr_t(es) | uintptr_t(256);
  return uint32_t(a & (~a + 1));
}
uint32_t align_of_ptr(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p) | uintptr_t(256);
  return uint32_t(a & (~a + 1));
}

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull; }
uint64_t problem_hash(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dd) {
  uint64_t h = 0;
  for (uint64_t v : {uint64_t(d.transa), uint64_t(d.transb), uint64_t(d.epilogue), uint64_t(d.aux_ld),
                     uint64_t(a.type), a.rows, a.cols, uint64_t(a.ld), b.rows, b.cols, uint64_t(b.ld), c.rows, c.cols,
                     uint64_t(c.ld), dd.rows, dd.cols, uint64_t(dd.ld), uint64_t(d.bias != nullptr)})
    h = mix(h, v);
  return h;
}

template <class T, class Opaque>
T* as(Opaque* p, uint64_t magic) {
  T* t = reinterpret_cast<T*>(p);
  return t && t->magic == magic ? t : nullptr;
}

bool known_epilogue(uint32_t e) {
  return e == CUBLASLT_EPILOGUE_DEFAULT || e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
         e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

// Validates one problem; m, n, k out.
cublasStatus_t validate(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dd, int64_t& m,
                        int64_t& n, int64_t& k) {
  if (d.compute != CUBLAS_COMPUTE_32F || d.scale != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "compute type %d / scale type %d not emulated (only COMPUTE_32F, "
                  "R_32F: strict fp32, no TF32)", int(d.compute), int(d.scale));
  const cudaDataType_t t = a.type;
  if (type_size(t) == 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "data type %d not emulated", int(t));
  if (b.type != t || c.type != t || dd.type != t)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "A, B, C, D of different types (%d %d %d %d) not emulated", int(a.type),
                  int(b.type), int(c.type), int(dd.type));
  if (!known_epilogue(d.epilogue)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "epilogue %u not emulated", d.epilogue);
  m = d.transa == CUBLAS_OP_N ? int64_t(a.rows) : int64_t(a.cols);
  k = d.transa == CUBLAS_OP_N ? int64_t(a.cols) : int64_t(a.rows);
  const int64_t kb = d.transb == CUBLAS_OP_N ? int64_t(b.rows) : int64_t(b.cols);
  n = d.transb == CUBLAS_OP_N ? int64_t(b.cols) : int64_t(b.rows);
  if (kb != k) return refuse(CUBLAS_STATUS_INVALID_VALUE, "op(A) is %ld x %ld but op(B) is %ld x %ld", m, k, kb, n);
  if (int64_t(dd.rows) != m || int64_t(dd.cols) != n || c.rows != dd.rows || c.cols != dd.cols)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "D is %lu x %lu (C %lu x %lu), op(A) op(B) is %ld x %ld", dd.rows,
                  dd.cols, c.rows, c.cols, m, n);
  const bool bias = d.epilogue == CUBLASLT_EPILOGUE_BIAS || d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool aux = d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX || d.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                   d.epilogue == CUBLASLT_EPILOGUE_DGELU;
  if (bias && d.bias_type_set && d.bias_type != int32_t(t))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "bias data type %d with D of type %d not emulated", d.bias_type, int(t));
  if (!bias && d.bias) return refuse(CUBLAS_STATUS_INVALID_VALUE, "bias pointer set but the epilogue has no bias");
  if (aux) {
    if (d.aux_ld < m || d.aux_ld % 8 != 0)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "EPILOGUE_AUX_LD %ld must be >= m (%ld) and divisible by 8",
                    long(d.aux_ld), long(m));
  }
  return CUBLAS_STATUS_SUCCESS;
}

float gelu(float x) {
  const float s = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(s * (x + 0.044715f * x * x * x)));
}
// d gelu / dx (what CUBLASLT_EPILOGUE_DGELU multiplies the product by), written out from the
// formula above: 0.5 (1 + tanh u) + 0.5 x sech^2(u) u',  u = s (x + 0.044715 x^3).
float gelu_grad(float x) {
  const float s = 0.7978845608028654f;
  const float th = std::tanh(s * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * s * (1.0f + 3.0f * 0.044715f * x * x);
}

float load(const void* p, size_t i, cudaDataType_t t) {
  return t == CUDA_R_32F ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}
void store(void* p, size_t i, float v, cudaDataType_t t) {
  if (t == CUDA_R_32F) static_cast<float*>(p)[i] = v;
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}
size_t extent_bytes(const Layout& l) { return ((l.cols - 1) * uint64_t(l.ld) + l.rows) * type_size(l.type); }

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) {
  banner();
  static int handle_storage;
  *h = reinterpret_cast<cublasLtHandle_t>(&handle_storage);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  auto* o = new cublasLtMatmulDescOpaque_t{};
  Desc* d = reinterpret_cast<Desc*>(o);
  *d = Desc{kMagicDesc, compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, 0, false, nullptr, nullptr, 0};
  *desc = o;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  Desc* d = as<Desc>(desc, kMagicDesc);
  if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, "MatmulDescSetAttribute on an invalid descriptor");
  auto need = [&](size_t s) { return size == s; };
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      if (!need(sizeof(int32_t))) break;
      int32_t v;
      std::memcpy(&v, buf, 4);
      if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "transpose op %d", v);
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      if (!need(sizeof(uint32_t))) break;
      std::memcpy(&d->epilogue, buf, 4);
      if (!known_epilogue(d->epilogue))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "epilogue %u not emulated (DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU)",
                      d->epilogue);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      if (!need(sizeof(int32_t))) break;
      std::memcpy(&d->bias_type, buf, 4);
      d->bias_type_set = true;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      if (!need(sizeof(void*))) break;
      std::memcpy(&d->bias, buf, sizeof(void*));
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      if (!need(sizeof(void*))) break;
      std::memcpy(&d->aux, buf, sizeof(void*));
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      if (!need(sizeof(int64_t))) break;
      std::memcpy(&d->aux_ld, buf, 8);
      return CUBLAS_STATUS_SUCCESS;
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "matmul descriptor attribute %d not emulated", int(attr));
  }
  return refuse(CUBLAS_STATUS_INVALID_VALUE, "matmul descriptor attribute %d: %zu bytes is not the size of its type",
                int(attr), size);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (type_size(type) == 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "layout of data type %d", int(type));
  if (rows == 0 || cols == 0 || ld < int64_t(rows))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "layout %lu x %lu with ld %ld (column-major: ld >= rows)", rows, cols,
                  long(ld));
  auto* o = new cublasLtMatrixLayoutOpaque_t{};
  *reinterpret_cast<Layout*>(o) = Layout{kMagicLayout, type, rows, cols, ld};
  *layout = o;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  auto* o = new cublasLtMatmulPreferenceOpaque_t{};
  *reinterpret_cast<Pref*>(o) = Pref{kMagicPref, 0, {256, 256, 256, 256}};
  *pref = o;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  Pref* p = as<Pref>(pref, kMagicPref);
  if (!p) return refuse(CUBLAS_STATUS_INVALID_VALUE, "PreferenceSetAttribute on an invalid preference");
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (size != sizeof(uint64_t)) break;
      std::memcpy(&p->max_ws, buf, 8);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      if (size != sizeof(uint32_t)) break;
      uint32_t v;
      std::memcpy(&v, buf, 4);
      if (v == 0 || (v & (v - 1))) return refuse(CUBLAS_STATUS_INVALID_VALUE, "alignment %u is not a power of two", v);
      p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = v;
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute %d not emulated", int(attr));
  }
  return refuse(CUBLAS_STATUS_INVALID_VALUE, "preference attribute %d: %zu bytes is not the size of its type",
                int(attr), size);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                              cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc,
                                              cublasLtMatrixLayout_t ld, cublasLtMatmulPreference_t pref,
                                              int requested, cublasLtMatmulHeuristicResult_t* results, int* found) {
  Desc* d = as<Desc>(desc, kMagicDesc);
  Layout *a = as<Layout>(la, kMagicLayout), *b = as<Layout>(lb, kMagicLayout), *c = as<Layout>(lc, kMagicLayout),
         *dd = as<Layout>(ld, kMagicLayout);
  Pref* p = as<Pref>(pref, kMagicPref);
  if (!d || !a || !b || !c || !dd || !p || requested < 1 || !results || !found)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "AlgoGetHeuristic: invalid argument");
  *found = 0;
  int64_t m = 0, n = 0, k = 0;
  const cublasStatus_t st = validate(*d, *a, *b, *c, *dd, m, n, k);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const size_t es = type_size(a->type);
  for (int i = 0; i < 4; ++i)
    if (p->align[i] < es)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "MIN_ALIGNMENT %u below the element size %zu", p->align[i], es);
  std::memset(results, 0, sizeof *results);
  Algo* algo = reinterpret_cast<Algo*>(&results->algo);
  *algo = Algo{kMagicAlgo, problem_hash(*d, *a, *b, *c, *dd), {p->align[0], p->align[1], p->align[2], p->align[3]},
               d->bias ? align_of_ptr(d->bias) : 0, d->aux ? align_of_ptr(d->aux) : 0};
  results->workspaceSize = 0;
  results->state = CUBLAS_STATUS_SUCCESS;
  results->wavesCount = 1.0f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t la, const void* B, cublasLtMatrixLayout_t lb, const void* beta,
                              const void* C, cublasLtMatrixLayout_t lc, void* D, cublasLtMatrixLayout_t ld,
                              const cublasLtMatmulAlgo_t* algo_p, void* workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
  Desc* d = as<Desc>(desc, kMagicDesc);
  Layout *a = as<Layout>(la, kMagicLayout), *b = as<Layout>(lb, kMagicLayout), *c = as<Layout>(lc, kMagicLayout),
         *dd = as<Layout>(ld, kMagicLayout);
  if (!handle || !d || !a || !b || !c || !dd || !alpha || !beta)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "Matmul: invalid argument");
  int64_t m = 0, n = 0, k = 0;
  const cublasStatus_t st = validate(*d, *a, *b, *c, *dd, m, n, k);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const Algo* algo = algo_p ? reinterpret_cast<const Algo*>(algo_p) : nullptr;
  if (!algo || algo->magic != kMagicAlgo)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "Matmul: algo does not come from cublasLtMatmulAlgoGetHeuristic");
  if (algo->problem != problem_hash(*d, *a, *b, *c, *dd))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "Matmul: algo was chosen for a different problem (shape, layout, "
                  "transpose or epilogue)");
  const size_t es = type_size(a->type);
  const void* ptrs[4] = {A, B, C, D};
  const Layout* lays[4] = {a, b, c, dd};
  static const char* names[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    const uint32_t have = align_of(ptrs[i], lays[i]->ld, es);
    if (have < algo->align[i])
      fatal("cublasLtMatmul: %s (%p, ld %ld) is only %u-byte aligned but the MIN_ALIGNMENT_%s preference promised "
            "%u: the chosen GPU kernel may fault or read wrong data",
            names[i], ptrs[i], long(lays[i]->ld), have, names[i], algo->align[i]);
  }
  if (C != D && (c->ld != dd->ld))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "Matmul: C != D with different layouts not emulated");
  const bool has_bias = d->epilogue == CUBLASLT_EPILOGUE_BIAS || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  const bool dgelu = d->epilogue == CUBLASLT_EPILOGUE_DGELU;  // aux read: the GELU's input
  const bool has_aux = d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || dgelu;
  if (has_bias && !d->bias) return refuse(CUBLAS_STATUS_INVALID_VALUE, "Matmul: bias epilogue without a bias pointer");
  if (has_aux && !d->aux) return refuse(CUBLAS_STATUS_INVALID_VALUE, "Matmul: GELU_AUX epilogue without an aux pointer");
  if (has_bias && align_of_ptr(d->bias) < algo->bias_align)
    fatal("cublasLtMatmul: bias pointer %p less aligned than when the algorithm was chosen", d->bias);
  if (has_aux && align_of_ptr(d->aux) < algo->aux_align)
    fatal("cublasLtMatmul: aux pointer %p less aligned than when the algorithm was chosen", d->aux);
  (void)workspace;
  (void)workspace_bytes;  // the emulated algorithms need none (heuristic reports workspaceSize 0)

  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  const cudaDataType_t t = a->type;
  const size_t aux_bytes = has_aux ? ((size_t(n) - 1) * size_t(d->aux_ld) + size_t(m)) * es : 0;
  char what[200];
  std::snprintf(what, sizeof what, "cublasLtMatmul(%s, m=%ld n=%ld k=%ld, op(A)=%c op(B)=%c, epilogue %u)",
                t == CUDA_R_32F ? "fp32" : "bf16", long(m), long(n), long(k), d->transa ? 'T' : 'N',
                d->transb ? 'T' : 'N', d->epilogue);
  OpScope op(stream, what,
             {{A, extent_bytes(*a), false, Where::device, "A"},
              {B, extent_bytes(*b), false, Where::device, "B"},
              {C, be != 0.0f ? extent_bytes(*c) : 0, false, Where::device, "C"},
              {has_bias ? d->bias : nullptr, has_bias ? size_t(m) * es : 0, false, Where::device, "bias"},
              {D, extent_bytes(*dd), true, Where::device, "D"},
              {has_aux ? d->aux : nullptr, aux_bytes, !dgelu, Where::device, "aux"}});

  // fp32 copies (stored shapes), product in fp32, epilogue, one rounding to T.
  auto widen = [&](const void* p, const Layout& l) {
    std::vector<float> v(size_t(l.rows) * l.cols);
    for (uint64_t j = 0; j < l.cols; ++j)
      for (uint64_t i = 0; i < l.rows; ++i) v[j * l.rows + i] = load(p, j * uint64_t(l.ld) + i, t);
    return v;
  };
  const std::vector<float> fa = widen(A, *a), fb = widen(B, *b);
  std::vector<float> acc(size_t(m) * size_t(n), 0.0f);
  if (be != 0.0f)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) acc[size_t(j * m + i)] = load(C, size_t(j * c->ld + i), t);
  cblas_sgemm(CblasColMajor, d->transa == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
              d->transb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), al, fa.data(),
              int(a->rows), fb.data(), int(b->rows), be, acc.data(), int(m));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      float x = acc[size_t(j * m + i)];
      if (has_bias) x += load(d->bias, size_t(i), t);
      if (dgelu) {
        x *= gelu_grad(load(d->aux, size_t(j * d->aux_ld + i), t));
      } else if (has_aux) {
        store(d->aux, size_t(j * d->aux_ld + i), x, t);
        x = gelu(x);
      }
      store(D, size_t(j * dd->ld + i), x, t);
    }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
