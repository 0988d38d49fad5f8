// A golden model opened and its weights bound (not yet loaded), for tests that reach the model
// layer below the C ABI.
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <utility>

#include "lib/model/hparams.h"
#include "lib/model/model_file.h"
#include "lib/model/weights.h"

namespace strata::testing {

struct BoundModel {
  std::unique_ptr<model::ModelFile> mf;
  model::HParams hp;
  model::ModelWeights w;
};

inline void BindModel(const std::string &path, BoundModel *b) {
  auto mf = model::ModelFile::Open(path);
  REQUIRE(mf.ok());
  b->mf = std::move(*mf);
  auto hp = model::ReadHParams(*b->mf);
  REQUIRE(hp.ok());
  b->hp = *hp;
  auto w = model::BindWeights(*b->mf, b->hp);
  REQUIRE(w.ok());
  b->w = std::move(*w);
}

}  // namespace strata::testing
