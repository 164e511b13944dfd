#include "hetseq/core/parse.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "hetseq/core/error.h"

namespace hetseq {
namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::string body = trim(text);
  if (body.size() >= 2 && ((body.front() == '(' && body.back() == ')') ||
                           (body.front() == '[' && body.back() == ']'))) {
    body = body.substr(1, body.size() - 2);
  }
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    const size_t comma = body.find(',', start);
    std::string item = trim(body.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (item.empty()) {
      throw UsageError(fmt::format("{}: '{}' is not a list of numbers (write e.g. '0.9,0.999' or '(0.9, 0.999)')",
                                   flag, text));
    }
    items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

}  // namespace

int64_t parse_int(const std::string& flag, const std::string& text) {
  const std::string t = trim(text);
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(t.c_str(), &end, 10);
  if (t.empty() || end != t.c_str() + t.size() || errno == ERANGE) {
    throw UsageError(fmt::format("{}: '{}' is not an integer", flag, text));
  }
  return static_cast<int64_t>(v);
}

double parse_double(const std::string& flag, const std::string& text) {
  const std::string t = trim(text);
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || errno == ERANGE || !std::isfinite(v)) {
    throw UsageError(fmt::format("{}: '{}' is not a finite number", flag, text));
  }
  return v;
}

std::vector<double> parse_double_list(const std::string& flag, const std::string& text) {
  std::vector<double> out;
  for (const auto& item : split_list(flag, text)) out.push_back(parse_double(flag, item));
  return out;
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  for (const auto& item : split_list(flag, text)) out.push_back(parse_int(flag, item));
  return out;
}

}  // namespace hetseq
