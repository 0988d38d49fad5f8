// Session snapshots: the on-disk format of moe_session_save / moe_session_load (the code lives
// with Context::SaveSession / LoadSession in snapshot.cc). Little-endian, version 1:
//
//   header (kSnapshotHeaderBytes)  magic "STRATASN", u32 version, u32 header bytes, u64 total bytes,
//                                  u64 model id, char arch[24], i32 x 10 hyper-parameters, u32
//                                  section count, u32 zero
//   sections                       u32 tag, u32 zero, u64 payload bytes, payload — options, state
//                                  (n_past, RNG), token history, pending input, logits, KV rows
//   trailer                        u32 CRC-32C of every byte before it
//
// A snapshot is refused, never half-applied, when it is truncated, its checksum disagrees, it was
// written for another model (architecture, hyper-parameters or tensor table differ) or by a newer
// format version.
#pragma once

#include <cstdint>

#include "lib/model/hparams.h"
#include "lib/model/model_file.h"

namespace strata::runtime {

inline constexpr char kSnapshotMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'S', 'N'};
inline constexpr uint32_t kSnapshotVersion = 1;
inline constexpr uint32_t kSnapshotHeaderBytes = 104;

// A 64-bit hash (FNV-1a) of what fixes a model's numbers: the architecture, the hyper-parameters
// and every tensor's name, type and shape. The same model file opened with any budget gives the
// same id; a different model or quantization gives another.
uint64_t ModelIdentity(const model::HParams &hp, const model::ModelFile &mf);

}  // namespace strata::runtime
