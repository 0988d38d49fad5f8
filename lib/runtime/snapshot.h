// Session snapshots: the on-disk format of moe_session_save / moe_session_load (the code lives
// with Context::SaveSession / LoadSession in snapshot.cc). Little-endian, version 4 (2 and 3 are
// read too: their options end before frequency_penalty (2) or before ctx_shift and n_keep (3),
// which load as 0):
//
//   header (kSnapshotHeaderBytes)  magic "STRATASN", u32 version, u32 header bytes, u64 total bytes,
//                                  u64 model id, u64 weights digest, char arch[24], i32 x 10
//                                  hyper-parameters, u32 section count, u32 zero
//   sections                       u32 tag, u32 zero, u64 payload bytes, payload — options, state
//                                  (n_past, RNG), token history, pending input, logits, KV rows
//   trailer                        u32 CRC-32C of every byte before it
//
// A snapshot is refused, never half-applied, when it is truncated, its checksum disagrees, it was
// written for another model (architecture, hyper-parameters, tensor table or weights differ) or by
// another format version (version 1, without the weights digest, is refused with a message saying
// to save the session again).
#pragma once

#include <cstdint>

#include "lib/model/hparams.h"
#include "lib/model/model_file.h"

namespace strata::runtime {

inline constexpr char kSnapshotMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'S', 'N'};
inline constexpr uint32_t kSnapshotVersion = 4;
inline constexpr uint32_t kSnapshotHeaderBytes = 112;

// A 64-bit hash (FNV-1a) of what fixes a model's numbers: the architecture, the hyper-parameters
// and every tensor's name, type and shape. The same model file opened with any budget gives the
// same id; a different model or quantization gives another.
uint64_t ModelIdentity(const model::HParams &hp, const model::ModelFile &mf);

// A 64-bit digest of the weights: every tensor's name, type, shape, file and offset, and a CRC-32C
// of a fixed sample of its bytes (the first and last 4 KiB, and two 4 KiB pieces evenly spaced
// between; a tensor of at most 16 KiB whole). A fine-tune or a re-quantization with the same
// tensor table changes the bytes of every tensor it touches, nearly always within any 4 KiB, so
// the sample tells such models apart while reading a few KiB per tensor at open. It guards against
// accidental mix-ups only: a change confined to unsampled bytes, or one made on purpose to keep
// the digest, goes unseen. A model with more than kWeightsDigestMaxPieces / 4 tensors (a checkpoint
// with one tensor per expert) samples fewer pieces per tensor, and past kWeightsDigestMaxPieces
// tensors only the first 4 KiB of every k-th one, so open stays cheap; names, shapes and offsets
// are always covered. MOE_ERR_IO_READ when the file cannot be read.
inline constexpr uint64_t kWeightsDigestPieceBytes = 4096;
inline constexpr uint64_t kWeightsDigestMaxPieces = 8192;
absl::StatusOr<uint64_t> WeightsDigest(const model::ModelFile &mf);

}  // namespace strata::runtime
