// storage/: locations, credentials, sizes, cache options and cancels (no server: tests/remote has
// those).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "../../storage/src/http.h"
#include "shardfeed/converter/pack.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/storage/remote.h"
#include "test_util.h"

using namespace shardfeed;
using namespace shardfeed::storage;

namespace {

// Sets (or unsets, for nullptr) environment variables for one scope, restoring them after.
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
      value ? ::setenv(name, value, 1) : ::unsetenv(name);
    }
  }
  ~Env() {
    for (auto& [name, value] : saved_) value ? ::setenv(name, value->c_str(), 1) : ::unsetenv(name);
  }

 private:
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

}  // namespace

TEST_CASE("remote locations are told from paths", "[storage]") {
  CHECK(IsRemote("s3://bucket/a"));
  CHECK(IsRemote("http://host/a"));
  CHECK(IsRemote("https://host/a"));
  CHECK_FALSE(IsRemote("/data/s3://x"));
  CHECK_FALSE(IsRemote("archive"));
  CHECK(Remote::Open("s3:///nobucket").status().code() == StatusCode::kInvalidArgument);
  CHECK(Remote::Open("ftp://host/a").status().code() == StatusCode::kInvalidArgument);
  // Schemes are case-insensitive; others are said to be unsupported, not "no such archive".
  CHECK(IsRemote("S3://bucket/a"));
  CHECK(IsRemote("HTTPS://host/a"));
  CHECK(CheckScheme("/data/archive").ok());
  CHECK(CheckScheme("s3://bucket/a").ok());
  for (const char* other : {"gs://bucket/a", "file:///data/a", "az://c/a"}) {
    const Status s = CheckScheme(other);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("is not a location shardfeed reads") != std::string::npos);
  }
  CHECK(Remote::Open("s3://").status().message().find("no bucket") != std::string::npos);
  CHECK(Remote::Open("http:///a").status().message().find("no host") != std::string::npos);
  // A password in the URL is refused, and not repeated in the message.
  const Status secret = Remote::Open("https://alice:s3cr3t@host/data").status();
  CHECK(secret.code() == StatusCode::kInvalidArgument);
  CHECK(secret.message().find("s3cr3t") == std::string::npos);
  CHECK(secret.message().find("https://alice:***@host/data") != std::string::npos);
}

TEST_CASE("sizes: bytes, SI and binary units", "[storage]") {
  CHECK(*ParseByteSize("1000") == 1000);
  CHECK(*ParseByteSize("20GB") == 20000000000ull);
  CHECK(*ParseByteSize("512MiB") == 512ull << 20);
  CHECK(*ParseByteSize("1.5k") == 1536);  // dd's rule: a bare K is 1024 (as --chunk-size)
  CHECK(*ParseByteSize("3KB") == 3000);
  CHECK(*ParseByteSize("2 Ti") == 2ull << 40);
  CHECK_FALSE(ParseByteSize("lots").ok());
  CHECK_FALSE(ParseByteSize("10 parsecs").ok());
  CHECK_FALSE(ParseByteSize("-1").ok());
}

TEST_CASE("S3 endpoints: path style for a custom endpoint, virtual host for AWS", "[storage]") {
  Env env{{"AWS_ENDPOINT_URL_S3", nullptr},     {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"},
          {"SHARDFEED_S3_ADDRESSING", nullptr}, {"AWS_REGION", "eu-west-1"},
          {"AWS_ACCESS_KEY_ID", "AKID"},        {"AWS_SECRET_ACCESS_KEY", "SECRET"},
          {"AWS_SESSION_TOKEN", nullptr}};
  auto e = internal::ParseEndpoint("s3://bkt/some/prefix/");
  REQUIRE(e.ok());
  CHECK(e->base == "http://127.0.0.1:9000/bkt/some/prefix");
  CHECK(e->region == "eu-west-1");
  CHECK(e->key_id == "AKID");
  {
    Env more{{"SHARDFEED_S3_ADDRESSING", "virtual"}, {"AWS_ENDPOINT_URL_S3", "https://r2.example"}};
    CHECK(internal::ParseEndpoint("s3://bkt/p")->base == "https://bkt.r2.example/p");
  }
  {
    Env aws{{"AWS_ENDPOINT_URL", nullptr}};
    CHECK(internal::ParseEndpoint("s3://bkt/p")->base ==
          "https://bkt.s3.eu-west-1.amazonaws.com/p");
    Env path{{"SHARDFEED_S3_ADDRESSING", "path"}};
    CHECK(internal::ParseEndpoint("s3://bkt")->base == "https://s3.eu-west-1.amazonaws.com/bkt");
    Env bad{{"SHARDFEED_S3_ADDRESSING", "sideways"}};
    CHECK(internal::ParseEndpoint("s3://bkt").status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("S3 credentials from AWS_PROFILE's section of the shared credentials file", "[storage]") {
  const auto dir = std::filesystem::temp_directory_path() / "shardfeed-storage-test";
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "credentials").string();
  std::ofstream(file) << "[default]\naws_access_key_id = DEF\naws_secret_access_key = DEFS\n"
                         "[work]\naws_access_key_id=WORK\naws_secret_access_key=WORKS\n"
                         "aws_session_token = TOK\n";
  Env env{{"AWS_ACCESS_KEY_ID", nullptr}, {"AWS_SECRET_ACCESS_KEY", nullptr},
          {"AWS_SESSION_TOKEN", nullptr}, {"AWS_SHARED_CREDENTIALS_FILE", file.c_str()},
          {"AWS_PROFILE", "work"},        {"AWS_ENDPOINT_URL", "http://127.0.0.1:1"}};
  auto e = internal::ParseEndpoint("s3://b/p");
  REQUIRE(e.ok());
  CHECK(e->key_id == "WORK");
  CHECK(e->secret == "WORKS");
  CHECK(e->token == "TOK");
  Env def{{"AWS_PROFILE", nullptr}};
  CHECK(internal::ParseEndpoint("s3://b/p")->key_id == "DEF");
  Env none{{"AWS_SHARED_CREDENTIALS_FILE", (dir / "absent").c_str()}};
  CHECK(internal::ParseEndpoint("s3://b/p")->key_id.empty());  // unsigned: a public bucket
  // Half a pair signed with an empty secret (a 403 "check the credentials"): refused.
  Env half{{"AWS_ACCESS_KEY_ID", "AKID"}};
  auto partial = internal::ParseEndpoint("s3://b/p");
  REQUIRE_FALSE(partial.ok());
  CHECK(partial.status().code() == StatusCode::kInvalidArgument);
  CHECK(partial.status().message().find("partial credentials") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("cache options: SetCacheOptions, then the environment, then XDG_CACHE_HOME",
          "[storage]") {
  SetCacheOptions({});
  {
    Env env{{"SHARDFEED_CACHE_DIR", nullptr},
            {"SHARDFEED_CACHE_LIMIT", nullptr},
            {"XDG_CACHE_HOME", "/x/cache"}};
    CHECK(ResolveCacheOptions()->dir == "/x/cache/shardfeed");
    CHECK(ResolveCacheOptions()->limit == 0);
    Env set{{"SHARDFEED_CACHE_DIR", "/y"}, {"SHARDFEED_CACHE_LIMIT", "2GB"}};
    CHECK(ResolveCacheOptions()->dir == "/y");
    CHECK(ResolveCacheOptions()->limit == 2000000000ull);
    SetCacheOptions({"/z", 5});
    CHECK(ResolveCacheOptions()->dir == "/z");
    CHECK(ResolveCacheOptions()->limit == 5);
    SetCacheOptions({});
    Env bad{{"SHARDFEED_CACHE_LIMIT", "much"}};
    CHECK(ResolveCacheOptions().status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("a refused request names the URL and never a secret; 404 is kNotFound at once",
          "[storage]") {
  Env env{{"AWS_ENDPOINT_URL", "http://127.0.0.1:1"},
          {"AWS_SECRET_ACCESS_KEY", "S3KR1T"},
          {"AWS_ACCESS_KEY_ID", "AKID"},
          {"SHARDFEED_FETCH_RETRIES", "1"},
          {"SHARDFEED_FETCH_MAX_DELAY", "0.01"}};
  auto remote = Remote::Open("s3://bucket/prefix");
  REQUIRE(remote.ok());
  auto text = (*remote)->ReadText("manifest.json", 1000);
  REQUIRE_FALSE(text.ok());
  CHECK(text.status().message().find("s3://bucket/prefix/manifest.json") != std::string::npos);
  CHECK(text.status().message().find("after 2 attempts") != std::string::npos);
  CHECK(text.status().message().find("S3KR1T") == std::string::npos);
  CHECK((*remote)->CheckLimit(1, "x").ok());
}

TEST_CASE("cache options: declared once; given options come before SetCacheOptions", "[storage]") {
  const auto& table = CacheOptionTable();
  CacheOptions o;
  REQUIRE(table.Set(&o, "cache_limit", "512MiB").ok());
  CHECK(o.limit == 512ull << 20);
  REQUIRE(table.Set(&o, "cache-limit", "20GB").ok());
  CHECK(o.limit == 20000000000ull);
  REQUIRE(table.Set(&o, "cache_dir", "/d").ok());
  CHECK(o.dir == "/d");
  const Status bad = table.Set(&o, "cache_limit", "lots");
  CHECK(bad.code() == StatusCode::kInvalidArgument);
  CHECK(bad.message().find("cache_limit (--cache-limit)") != std::string::npos);
  CHECK(table.Unknown("cache_dri").message().find("cache_dir") != std::string::npos);
  Env env{{"SHARDFEED_CACHE_DIR", "/env"}, {"SHARDFEED_CACHE_LIMIT", "10000"}};
  SetCacheOptions({"/process", 7});
  CHECK(ResolveCacheOptions({"/given", 9})->dir == "/given");
  CHECK(ResolveCacheOptions({"/given", 9})->limit == 9);
  CHECK(ResolveCacheOptions({"", 9})->dir == "/process");
  CHECK(ResolveCacheOptions({"/given", 0})->limit == 7);
  SetCacheOptions({});
  CHECK(ResolveCacheOptions({"/given", 0})->limit == 10000);
  // Below 4 KiB no shard fits: refused (0 and 0.5 used to mean no limit, 1.5 one byte).
  for (const char* tiny : {"0", "0.5", "1.5", "4095"}) {
    CHECK(table.Set(&o, "cache_limit", tiny).code() == StatusCode::kInvalidArgument);
  }
  Env small{{"SHARDFEED_CACHE_LIMIT", "1000"}};
  CHECK(ResolveCacheOptions({"/given", 0}).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("ReleaseShard unmaps a shard; its next access opens it again, same bytes",
          "[storage][release]") {
  testing::TempDir dir;
  auto src = converter::ScanImageFolder(testing::SampleDir());
  REQUIRE(src.ok());
  converter::PackOptions po;
  po.writer.shard_bytes = 30000;
  converter::PackResult result;
  REQUIRE(converter::Pack(*src, dir / "a", po, &result).ok());
  auto opened = format::Archive::Open(dir / "a", format::IndexCheck::kLazy);
  REQUIRE(opened.ok());
  format::Archive& a = **opened;
  REQUIRE(a.shard_count() >= 3);
  const uint64_t last = a.size() - 1;
  const size_t s = a.ShardOf(last);
  auto before = a.At(last);
  REQUIRE(before.ok());
  const std::vector<uint8_t> bytes(before->data, before->data + before->size);
  CHECK(a.ShardOpen(s));
  CHECK(a.OpenedShards() == 1);
  a.ReleaseShard(s);
  CHECK_FALSE(a.ShardOpen(s));
  CHECK(a.OpenedShards() == 0);
  a.ReleaseShard(s);  // not open: nothing to do
  auto again = a.At(last);
  REQUIRE(again.ok());
  CHECK(std::vector<uint8_t>(again->data, again->data + again->size) == bytes);
  CHECK(a.VerifyRecord(last).ok());
  REQUIRE(a.OpenShardNow(0).ok());
  CHECK(a.ShardOpen(0));
  CHECK(a.OpenShardNow(a.shard_count()).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("an exception in an upload or ranged-download thread is the call's error", "[storage]") {
  // REGRESSION: UploadArchive's and Download's threads ran their work with no catch: an
  // exception there (bad_alloc, a throwing callback) ended the process with std::terminate.
  std::atomic<int> next{0}, done{0};
  auto work = [&] {
    for (int i; (i = next.fetch_add(1)) < 40;) {
      if (i == 5) throw std::runtime_error("item 5 failed");
      done.fetch_add(1);
    }
  };
  const Status s = storage::internal::RunOnThreads(4, "uploading s3://b/p", work);
  CHECK(s.code() == StatusCode::kInternal);
  CHECK(s.message().find("uploading s3://b/p: item 5 failed") != std::string::npos);
  CHECK(done.load() == 39);  // the others went on, and every thread was joined
  CHECK(storage::internal::RunOnThreads(3, "x", [] {}).ok());
}

// The open of a held cache copy retries, rather than failing, when another process discarded
// the copy between the fetch and the open: named() is how it tells.
TEST_CASE("a held cached copy knows when its name no longer names it", "[storage]") {
  testing::TempDir dir;
  const std::string path = dir / "shard.lmdb.0123456789abcdef";
  std::ofstream(path) << "copy";
  CachedFile held(path, ::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(held.fd() >= 0);
  CHECK(held.named());
  std::filesystem::remove(path);  // what another process's Discard does
  CHECK_FALSE(held.named());
  std::ofstream(path) << "a fresh download";  // another file now has the name
  CHECK_FALSE(held.named());
}

namespace {

// Cancels `token` after `ms` milliseconds, from a thread of its own (joined when it goes).
class CancelLater {
 public:
  CancelLater(CancelToken* token, int ms)
      : thread_([token, ms] {
          std::this_thread::sleep_for(std::chrono::milliseconds(ms));
          token->Cancel();
        }) {}
  ~CancelLater() { thread_.join(); }

 private:
  std::thread thread_;
};

std::vector<std::string> PartFiles(const std::string& root) {
  std::vector<std::string> parts;
  for (const auto& f : std::filesystem::recursive_directory_iterator(root)) {
    if (f.path().extension() == ".part") parts.push_back(f.path().string());
  }
  return parts;
}

}  // namespace

// Each wait below would last an hour (retries up to an hour apart, another process's download
// waited for up to 10 minutes) if the token did not end it: a failure is a hang, caught by
// CTest's timeout, or another code than kCancelled.
TEST_CASE("a cancel ends a request's back-off, a wait for another download and a download",
          "[storage]") {
  testing::TempDir dir;
  Env env{{"AWS_ENDPOINT_URL", "http://127.0.0.1:1"},  // nothing listens: refused, retried
          {"AWS_ACCESS_KEY_ID", "AKID"},
          {"AWS_SECRET_ACCESS_KEY", "SECRET"},
          {"SHARDFEED_FETCH_RETRIES", "100"},
          {"SHARDFEED_FETCH_MAX_DELAY", "3600"},
          {"SHARDFEED_FETCH_WAIT", "600"},
          {"SHARDFEED_CACHE_DIR", nullptr},
          {"SHARDFEED_CACHE_LIMIT", nullptr}};
  auto remote = Remote::Open("s3://bucket/prefix", CacheOptions{dir.path(), 0});
  REQUIRE(remote.ok());
  bool verified = false;
  auto verify = [&](const std::string&) { return verified = true, Status::OK(); };
  const std::string name = "shard-00000.mdb", version = "0123456789abcdef";

  SECTION("a token cancelled before the call: nothing is sent, no file is left") {
    CancelToken cancel;
    cancel.Cancel();
    const uint64_t requests = GetFetchStats().requests;
    CHECK((*remote)->ReadText("manifest.json", 1000, &cancel).status().code() ==
          StatusCode::kCancelled);
    auto fetched = (*remote)->Fetch(name, 4096, version, verify, &cancel);
    CHECK(fetched.status().code() == StatusCode::kCancelled);
    CHECK(fetched.status().message().find("s3://bucket/prefix/" + name) != std::string::npos);
    CHECK(GetFetchStats().requests == requests);
    CHECK(PartFiles(dir.path()).empty());  // the reserved ".part" was removed
    CHECK_FALSE(verified);
  }
  SECTION("a retry's back-off") {
    CancelToken cancel;
    CancelLater later(&cancel, 300);
    auto fetched = (*remote)->Fetch(name, 4096, version, verify, &cancel);
    CHECK(fetched.status().code() == StatusCode::kCancelled);
    CHECK(PartFiles(dir.path()).empty());
    CHECK_FALSE(verified);
  }
  SECTION("a wait for another process's download of the same shard") {
    CancelToken now;
    now.Cancel();  // a first call makes the shard's lock file, <cache>/remote/<key>/<file>.lock
    REQUIRE((*remote)->Fetch(name, 4096, version, verify, &now).status().code() ==
            StatusCode::kCancelled);
    std::string shard_lock;
    for (const auto& f : std::filesystem::recursive_directory_iterator(dir.path())) {
      if (f.path().filename() == name + "." + version + ".lock") shard_lock = f.path().string();
    }
    REQUIRE_FALSE(shard_lock.empty());
    // Held as another process's download holds it (the flock of another open file description
    // conflicts within one process too).
    const int held = ::open(shard_lock.c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(held >= 0);
    REQUIRE(::flock(held, LOCK_EX) == 0);
    CancelToken cancel;
    {
      CancelLater later(&cancel, 300);
      auto fetched = (*remote)->Fetch(name, 4096, version, verify, &cancel);
      CHECK(fetched.status().code() == StatusCode::kCancelled);
      CHECK(fetched.status().message().find("another process") != std::string::npos);
    }
    ::close(held);
  }
}

TEST_CASE("a cancelled Archive::Open returns kCancelled (the manifest's retries)", "[storage]") {
  Env env{{"AWS_ENDPOINT_URL", "http://127.0.0.1:1"},
          {"SHARDFEED_FETCH_RETRIES", "100"},
          {"SHARDFEED_FETCH_MAX_DELAY", "3600"}};
  CancelToken cancel;
  format::OpenOptions options;
  options.cancel = &cancel;
  CancelLater later(&cancel, 200);
  auto opened = format::Archive::Open("s3://bucket/prefix", options);
  CHECK(opened.status().code() == StatusCode::kCancelled);
}
