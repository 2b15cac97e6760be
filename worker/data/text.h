// Byte-level language-modelling data: a plain-text corpus split into a training and a
// held-out part, cut into windows a language model trains on.
//
// The corpus is Debian's `fortunes` package (/usr/share/games/fortunes): about 2.4 MB of
// plain English text (quotations, jokes, definitions, poems, a few pieces of ASCII art)
// in files that need no decoder, held out by whole fortunes so that no text of the held-out
// part is seen in training. At the speeds of this project's CPU workers that is about one
// epoch in a 10-minute run of a 4-layer, width-256 model.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/dataset.h"

namespace pscluster::data {

inline constexpr char kDefaultFortunesDir[] = "/usr/share/games/fortunes";
inline constexpr int kByteVocab = 256;

struct TextCorpus {
  std::string train;
  std::string held_out;
};

// Reads every fortune file of `dir` (the files whose names have no '.': not the .dat
// indexes or .u8 links), sorted by name, and splits them into fortunes at the lines that
// are a lone "%". Every `held_out_every`-th fortune, counted over all files in that order,
// goes to held_out, the others to train; each fortune keeps its text and is followed by
// "%\n" as in the files. NOT_FOUND (with the package to install) when `dir` has no
// fortune files; INVALID_ARGUMENT for held_out_every < 2.
absl::StatusOr<TextCorpus> LoadFortunes(const std::string& dir, int held_out_every = 10);

// Windows of a byte-level language model over `text`: example i holds bytes
// [i * context, (i + 1) * context) as x (floats 0..255, dim = context) and the bytes one
// further on, [i * context + 1, (i + 1) * context + 1), as its labels (label_width =
// context, classes = 256). Windows that would run past the end are dropped.
// INVALID_ARGUMENT for context < 1 or a text shorter than one window plus a byte.
absl::StatusOr<Dataset> MakeLanguageModelData(absl::string_view text, int context);

}  // namespace pscluster::data
