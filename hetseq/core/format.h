#pragma once
/// String formatting for hetseq: the {fmt} library that LibTorch ships, used header-only
/// (FMT_HEADER_ONLY is set on the hetseq target). Include this, never <spdlog/...>: the system's
/// spdlog is built against another {fmt} and is used only behind hetseq/core/logging.h.

#include <fmt/format.h>
#include <fmt/ranges.h>
