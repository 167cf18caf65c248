// Helpers shared by the C++ tests.
#pragma once

#include <unistd.h>

#include <catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace shardfeed::testing {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "shardfeed-test-XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back(0);
    REQUIRE(::mkdtemp(buf.data()) != nullptr);
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void WriteBytes(const std::string& path, const std::vector<uint8_t>& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  REQUIRE(out.good());
}

// The sample data made by scripts/make_sample_data.py (CTest fixture "sample_data").
inline std::string SampleDir() {
  const char* d = std::getenv("SHARDFEED_TEST_DATA");
  std::string base = d ? d : SHARDFEED_BINARY_DIR "/test-data";
  return base + "/good";
}
inline std::string FormatsDir() {
  const char* d = std::getenv("SHARDFEED_TEST_DATA");
  std::string base = d ? d : SHARDFEED_BINARY_DIR "/test-data";
  return base + "/formats";
}
inline std::string BadDir() {
  const char* d = std::getenv("SHARDFEED_TEST_DATA");
  std::string base = d ? d : SHARDFEED_BINARY_DIR "/test-data";
  return base + "/bad";
}

}  // namespace shardfeed::testing
