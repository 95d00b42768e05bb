// Token shards, the data loader's batch layout, and the GPT-2 decode table.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "runtime/error.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using zt::DataLoader;
using zt::write_token_shard;

namespace {

// A fresh directory per test, removed afterwards.
class DataTest : public TempDirTest {
 protected:
  DataTest() : TempDirTest("zt_data") {}

  // Shard whose token i is base + i: a sequence is identified by its first token.
  std::string iota_shard(const std::string& name, int n, int base) {
    std::vector<uint16_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[size_t(i)] = uint16_t(base + i);
    write_token_shard(path(name), t);
    return path(name);
  }

};

// Runs f, expects a zt::Error whose message contains every one of the given pieces.
template <class F>
void expect_error(F f, std::initializer_list<std::string> pieces) {
  try {
    f();
    ADD_FAILURE() << "expected zt::Error";
  } catch (const zt::Error& e) {
    const std::string msg = e.what();
    for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

// The message of the zt::Error that `read` throws when it is given the FIFO `fifo` ("" if none).
// A reader that opens the FIFO blocks until a writer comes: after 10 s one comes (so the test ends)
// and the result is "blocked".
template <class F>
std::string fifo_error(const std::string& fifo, F read) {
  auto result = std::async(std::launch::async, [&]() -> std::string {
    try {
      read();
    } catch (const zt::Error& e) {
      return e.what();
    }
    return "";
  });
  if (result.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return result.get();
  const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // the blocked open returns
  if (w >= 0) ::close(w);
  (void)result.get();
  return "blocked";
}

void write_raw(const std::string& path, const std::vector<int32_t>& header, size_t extra_bytes) {
  std::vector<int32_t> h(256, 0);
  std::copy(header.begin(), header.end(), h.begin());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(h.data()), 1024);
  std::vector<char> body(extra_bytes, 0);
  f.write(body.data(), std::streamsize(body.size()));
}

struct Batch {
  std::vector<int> in, tg;
  bool operator==(const Batch& o) const { return in == o.in && tg == o.tg; }
};

Batch train(DataLoader& dl, int B, int T, int64_t step, int micro, int ga) {
  Batch b{std::vector<int>(size_t(B) * T), std::vector<int>(size_t(B) * T)};
  dl.train_batch(step, micro, ga, b.in.data(), b.tg.data());
  return b;
}

Batch eval(DataLoader& dl, int B, int T, int64_t i) {
  Batch b{std::vector<int>(size_t(B) * T), std::vector<int>(size_t(B) * T)};
  dl.eval_batch(i, b.in.data(), b.tg.data());
  return b;
}

// First token of each row: which sequence it is.
std::vector<int> starts(const Batch& b, int B, int T) {
  std::vector<int> s;
  for (int r = 0; r < B; ++r) s.push_back(b.in[size_t(r) * T]);
  return s;
}

}  // namespace

// ---- shards --------------------------------------------------------------------------------------

TEST_F(DataTest, ShardRoundTrip) {
  std::vector<uint16_t> t = {50256, 15496, 995, 0, 65535, 7};
  write_token_shard(path("a.bin"), t);
  EXPECT_EQ(fs::file_size(path("a.bin")), 1024u + 2 * t.size());
  // header as llm.c writes it
  std::ifstream f(path("a.bin"), std::ios::binary);
  int32_t h[3];
  f.read(reinterpret_cast<char*>(h), sizeof(h));
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 6);

  zt::TokenShard s(path("a.bin"));
  EXPECT_EQ(s.path(), path("a.bin"));
  ASSERT_EQ(s.size(), t.size());
  EXPECT_TRUE(std::equal(t.begin(), t.end(), s.tokens()));

  zt::TokenShard moved(std::move(s));
  EXPECT_EQ(moved.size(), t.size());
  EXPECT_EQ(moved.tokens()[1], 15496);
}

// The start-up scan for ids outside the vocabulary: the first one, wherever it falls in the
// scan's blocks, and none when every id fits.
TEST_F(DataTest, FirstTokenOutsideVocabulary) {
  std::vector<uint16_t> t(200000, 7);
  t[131073] = 50257;  // just past the second block boundary
  t[150000] = 65535;
  write_token_shard(path("bad.bin"), t);
  const zt::TokenShard s(path("bad.bin"));
  EXPECT_EQ(s.first_token_at_least(50257), 131073u);
  EXPECT_EQ(s.first_token_at_least(50258), 150000u);
  EXPECT_EQ(s.first_token_at_least(65536), s.size());
  EXPECT_EQ(s.first_token_at_least(8), 131073u);
  EXPECT_EQ(s.first_token_at_least(7), 0u);

  iota_shard("a_good.bin", 100, 0);
  DataLoader dl(path("*.bin"), 1, 4, 0, 1, 1, false);
  const auto bad = dl.first_token_at_least(50257);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->file, path("bad.bin"));  // after a_good.bin in file order
  EXPECT_EQ(bad->position, 131073u);
  EXPECT_EQ(bad->id, 50257);
  EXPECT_FALSE(dl.first_token_at_least(65536).has_value());
}

TEST_F(DataTest, EmptyShardIsValid) {
  write_token_shard(path("e.bin"), {});
  zt::TokenShard s(path("e.bin"));
  EXPECT_EQ(s.size(), 0u);
}

TEST_F(DataTest, ShardErrorsNameFileAndProblem) {
  expect_error([&] { zt::TokenShard s(path("missing.bin")); }, {path("missing.bin"), "cannot open"});

  write_raw(path("magic.bin"), {123, 1, 4}, 8);
  expect_error([&] { zt::TokenShard s(path("magic.bin")); }, {path("magic.bin"), "bad magic 123", "20240520"});

  write_raw(path("version.bin"), {20240520, 7, 4}, 8);
  expect_error([&] { zt::TokenShard s(path("version.bin")); }, {path("version.bin"), "version 7"});

  iota_shard("trunc.bin", 100, 0);
  fs::resize_file(path("trunc.bin"), 1024 + 2 * 60);
  expect_error([&] { zt::TokenShard s(path("trunc.bin")); }, {path("trunc.bin"), "100 tokens", "truncated"});

  iota_shard("long.bin", 10, 0);
  fs::resize_file(path("long.bin"), 1024 + 2 * 10 + 2);
  expect_error([&] { zt::TokenShard s(path("long.bin")); }, {path("long.bin"), "trailing"});

  { std::ofstream(path("tiny.bin")) << "hello"; }
  expect_error([&] { zt::TokenShard s(path("tiny.bin")); }, {path("tiny.bin"), "too small"});

  fs::create_directory(path("adir"));
  expect_error([&] { zt::TokenShard s(path("adir")); }, {path("adir")});
}

TEST_F(DataTest, GlobSortsAndReportsNoMatch) {
  iota_shard("train_002.bin", 10, 0);
  iota_shard("train_000.bin", 10, 0);
  iota_shard("train_001.bin", 10, 0);
  const auto files = zt::glob_files(path("train_*.bin"));
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0], path("train_000.bin"));
  EXPECT_EQ(files[2], path("train_002.bin"));
  expect_error([&] { zt::glob_files(path("val_*.bin")); }, {path("val_*.bin"), "no file matches"});
}

// ---- loader --------------------------------------------------------------------------------------

TEST_F(DataTest, LoaderErrors) {
  expect_error([&] { DataLoader dl(path("nothing_*.bin"), 2, 4, 0, 1, 1, false); }, {"no file matches"});
  expect_error([&] { DataLoader dl(path("nothing.bin"), 2, 4, 0, 1, 1, false); }, {path("nothing.bin"), "cannot open"});
  // T+1 tokens are needed for one sequence
  iota_shard("short.bin", 8, 0);
  expect_error([&] { DataLoader dl(path("short.bin"), 1, 8, 0, 1, 1, false); }, {path("short.bin"), "no sequence"});
  DataLoader ok(path("short.bin"), 1, 7, 0, 1, 1, false);
  EXPECT_EQ(ok.num_sequences(), 1u);
  expect_error([&] { DataLoader dl(path("short.bin"), 1, 4, 2, 2, 1, false); }, {"rank 2"});
}

TEST_F(DataTest, SequencesAtStrideTAcrossShards) {
  const int T = 8, B = 3;
  iota_shard("train_000.bin", 8 * 5 + 1, 0);     // exactly 5 sequences
  iota_shard("train_001.bin", 8 * 4 + 7, 1000);  // 4 sequences, 6 tokens unused
  DataLoader dl(path("train_*.bin"), B, T, 0, 1, 42, false);
  EXPECT_EQ(dl.files().size(), 2u);
  EXPECT_EQ(dl.num_tokens(), 41u + 39u);
  ASSERT_EQ(dl.num_sequences(), 9u);

  // Unshuffled: global sequence g is the g-th sequence in file order.
  const std::vector<int> expect = {0, 8, 16, 24, 32, 1000, 1008, 1016, 1024};
  std::vector<int> seen;
  for (int64_t step = 0; step < 3; ++step) {
    Batch b = train(dl, B, T, step, 0, 1);
    for (int r = 0; r < B; ++r)
      for (int t = 0; t < T; ++t) {
        // targets are the inputs shifted by one, within one contiguous run of T+1 tokens
        EXPECT_EQ(b.tg[size_t(r * T + t)], b.in[size_t(r * T + t)] + 1);
        if (t > 0) {
          EXPECT_EQ(b.in[size_t(r * T + t)], b.in[size_t(r * T + t - 1)] + 1);
        }
      }
    for (int s : starts(b, B, T)) seen.push_back(s);
  }
  EXPECT_EQ(seen, expect);
}

TEST_F(DataTest, RanksAreDisjointAndMatchOneRank) {
  const int T = 4, B = 2, ga = 2;
  iota_shard("train_000.bin", 4 * 50 + 1, 0);
  iota_shard("train_001.bin", 4 * 23 + 1, 5000);  // 73 sequences: steps of G=8 wrap epochs unevenly
  for (bool shuffle : {false, true}) {
    DataLoader one(path("train_*.bin"), B, T, 0, 1, 7, shuffle);
    DataLoader r0(path("train_*.bin"), B, T, 0, 2, 7, shuffle);
    DataLoader r1(path("train_*.bin"), B, T, 1, 2, 7, shuffle);
    for (int64_t step = 0; step < 25; ++step) {
      std::multiset<int> world1, world2;
      std::set<int> rank0, rank1;
      for (int m = 0; m < 2 * ga; ++m)
        for (int s : starts(train(one, B, T, step, m, 2 * ga), B, T)) world1.insert(s);
      for (int m = 0; m < ga; ++m) {
        Batch a = train(r0, B, T, step, m, ga), b = train(r1, B, T, step, m, ga);
        // rank r, micro m of world 2 is micro m*2+r of world 1 with the same global batch G
        EXPECT_EQ(a, train(one, B, T, step, 2 * m + 0, 2 * ga)) << "step " << step << " micro " << m;
        EXPECT_EQ(b, train(one, B, T, step, 2 * m + 1, 2 * ga)) << "step " << step << " micro " << m;
        for (int s : starts(a, B, T)) rank0.insert(s), world2.insert(s);
        for (int s : starts(b, B, T)) rank1.insert(s), world2.insert(s);
      }
      EXPECT_EQ(world1, world2);
      EXPECT_EQ(world2.size(), size_t(2 * ga * B));
      const int64_t G = 2 * ga * B, N = int64_t(one.num_sequences());
      if ((step * G) / N == (step * G + G - 1) / N) {  // within one epoch ranks never share a sequence
        for (int s : rank0) EXPECT_EQ(rank1.count(s), 0u) << "step " << step << " shuffle " << shuffle;
      }
    }
  }
}

TEST_F(DataTest, ShuffleIsDeterministicPerSeedAndEpoch) {
  const int T = 4, B = 5;
  iota_shard("train_000.bin", 4 * 40 + 1, 0);
  DataLoader a(path("train_000.bin"), B, T, 0, 1, 1337, true);
  DataLoader b(path("train_000.bin"), B, T, 0, 1, 1337, true);
  DataLoader c(path("train_000.bin"), B, T, 0, 1, 1338, true);
  DataLoader plain(path("train_000.bin"), B, T, 0, 1, 1337, false);
  bool differs_seed = false, differs_plain = false;
  for (int64_t step = 0; step < 8; ++step) {  // one epoch: 40 sequences, 5 per step
    Batch x = train(a, B, T, step, 0, 1);
    EXPECT_EQ(x, train(b, B, T, step, 0, 1));
    differs_seed |= !(x == train(c, B, T, step, 0, 1));
    differs_plain |= !(x == train(plain, B, T, step, 0, 1));
  }
  EXPECT_TRUE(differs_seed);
  EXPECT_TRUE(differs_plain);
  // The order of calls does not matter: step 3 read after step 7 is still step 3.
  Batch late = train(a, B, T, 3, 0, 1);
  train(a, B, T, 20, 0, 1);
  EXPECT_EQ(late, train(a, B, T, 3, 0, 1));
  EXPECT_EQ(late, train(b, B, T, 3, 0, 1));
}

TEST_F(DataTest, EpochsWrapAndPermute) {
  const int T = 4, B = 1;
  const int N = 30;
  iota_shard("train_000.bin", T * N + 1, 0);
  DataLoader plain(path("train_000.bin"), B, T, 0, 1, 9, false);
  DataLoader shuf(path("train_000.bin"), B, T, 0, 1, 9, true);
  std::vector<int> all;
  for (int i = 0; i < N; ++i) all.push_back(i * T);
  std::vector<std::vector<int>> epochs;
  for (int e = 0; e < 3; ++e) {
    std::vector<int> p, s;
    for (int i = 0; i < N; ++i) {
      p.push_back(starts(train(plain, B, T, int64_t(e) * N + i, 0, 1), B, T)[0]);
      s.push_back(starts(train(shuf, B, T, int64_t(e) * N + i, 0, 1), B, T)[0]);
    }
    EXPECT_EQ(p, all) << "unshuffled epoch " << e << " repeats the file order";
    EXPECT_NE(s, all) << "shuffled epoch " << e;
    std::vector<int> sorted = s;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, all) << "shuffled epoch " << e << " visits every sequence once";
    epochs.push_back(s);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
}

// The permutation is ours (splitmix64 + Fisher-Yates), so it is the same on every platform and
// standard library; these orders are pinned so a change to it is a visible, deliberate decision.
TEST_F(DataTest, ShuffleOrderIsPinned) {
  iota_shard("g.bin", 41, 0);  // 10 sequences of T=4
  DataLoader dl(path("g.bin"), 1, 4, 0, 1, 1337, true);
  std::vector<int> order;
  for (int64_t g = 0; g < 20; ++g) order.push_back(starts(train(dl, 1, 4, g, 0, 1), 1, 4)[0] / 4);
  const std::vector<int> expect = {0, 4, 2, 5, 7, 1, 3, 6, 8, 9,   // epoch 0
                                   9, 6, 7, 2, 1, 3, 0, 8, 5, 4};  // epoch 1
  EXPECT_EQ(order, expect);
}

TEST_F(DataTest, EvalBatchesAreSequentialPerRank) {
  const int T = 4, B = 2;
  iota_shard("val.bin", 4 * 11 + 1, 100);  // 11 sequences
  DataLoader one(path("val.bin"), B, T, 0, 1, 5, /*shuffle=*/true);  // eval ignores shuffle
  EXPECT_EQ(one.num_eval_batches(), 5);
  for (int64_t i = 0; i < 5; ++i) {
    Batch b = eval(one, B, T, i);
    EXPECT_EQ(starts(b, B, T), (std::vector<int>{100 + int(2 * i) * T, 100 + int(2 * i + 1) * T}));
    for (size_t k = 0; k < b.in.size(); ++k) EXPECT_EQ(b.tg[k], b.in[k] + 1);
  }
  expect_error([&] { eval(one, B, T, 5); }, {"eval batch 5", "out of range"});

  DataLoader r0(path("val.bin"), B, T, 0, 2, 5, false), r1(path("val.bin"), B, T, 1, 2, 5, false);
  EXPECT_EQ(r0.num_eval_batches(), 2);
  for (int64_t i = 0; i < 2; ++i) {
    // eval batch i of rank r = sequences (i*world + r)*B + [0, B)
    EXPECT_EQ(eval(r0, B, T, i), eval(one, B, T, 2 * i));
    EXPECT_EQ(eval(r1, B, T, i), eval(one, B, T, 2 * i + 1));
  }
}

// ---- tokenizer -----------------------------------------------------------------------------------

namespace {
const std::string kSampleTokenizer = std::string(ZT_SOURCE_DIR) + "/data/sample/gpt2_tokenizer.bin";

int find_token(const zt::Tokenizer& tok, const std::string& bytes) {
  for (int i = 0; i < tok.vocab_size(); ++i)
    if (tok.decode(i) == bytes) return i;
  return -1;
}
}  // namespace

TEST(Tokenizer, DecodesKnownGpt2Tokens) {
  zt::Tokenizer tok(kSampleTokenizer);
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eot(), 50256);
  EXPECT_EQ(tok.decode(15496), "Hello");
  EXPECT_EQ(tok.decode(995), " world");
  EXPECT_EQ(tok.decode(11), ",");
  EXPECT_EQ(tok.decode(198), "\n");
  EXPECT_EQ(tok.decode(50256), "<|endoftext|>");
  EXPECT_EQ(tok.decode(-1), "");
  EXPECT_EQ(tok.decode(50257), "");
  EXPECT_EQ(tok.decode(std::vector<int>{15496, 11, 995}), "Hello, world");
}

TEST(Tokenizer, RepairsSplitUtf8) {
  zt::Tokenizer tok(kSampleTokenizer);
  // GPT-2 has a token for every single byte; an em dash (E2 80 94) split into three byte tokens
  // must decode back to the character, and a lone lead byte must become U+FFFD.
  const int e2 = find_token(tok, "\xE2"), x80 = find_token(tok, "\x80"), x94 = find_token(tok, "\x94");
  ASSERT_GE(e2, 0);
  ASSERT_GE(x80, 0);
  ASSERT_GE(x94, 0);
  EXPECT_EQ(tok.decode(std::vector<int>{15496, e2, x80, x94}), "Hello\xE2\x80\x94");
  EXPECT_EQ(tok.decode(std::vector<int>{e2, 15496}), "\xEF\xBF\xBDHello");
  EXPECT_EQ(tok.decode(std::vector<int>{e2, x80, 995}), "\xEF\xBF\xBD world");   // truncated 3-byte form
  EXPECT_EQ(tok.decode(std::vector<int>{x80, x94}), "\xEF\xBF\xBD\xEF\xBF\xBD");  // stray continuations
  const int c0 = find_token(tok, "\xC0"), af = find_token(tok, "\xAF");
  ASSERT_GE(c0, 0);
  ASSERT_GE(af, 0);
  EXPECT_EQ(tok.decode(std::vector<int>{c0, af}), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong '/'
}

// Every input is checked by kind before it is opened: a FIFO as data.train / data.val hung the run
// forever (issue 50), one as the tokenizer too.
TEST_F(DataTest, FifoInputsRefusedBeforeTheOpen) {
  ASSERT_EQ(::mkfifo(path("fifo.bin").c_str(), 0600), 0);
  std::string e = fifo_error(path("fifo.bin"), [&] { zt::TokenShard s(path("fifo.bin")); });
  EXPECT_EQ(e, "data file " + path("fifo.bin") + " is a FIFO, not a regular file");
  iota_shard("a.bin", 100, 0);
  e = fifo_error(path("fifo.bin"), [&] { DataLoader dl(path("*.bin"), 2, 4, 0, 1, 1, false); });
  EXPECT_EQ(e, "data file " + path("fifo.bin") + " is a FIFO, not a regular file");
  e = fifo_error(path("fifo.bin"), [&] { zt::Tokenizer t(path("fifo.bin")); });
  EXPECT_EQ(e, "tokenizer file " + path("fifo.bin") + " is a FIFO, not a regular file");
  fs::create_symlink(path("nowhere.bin"), path("dangling.bin"));
  expect_error([&] { zt::TokenShard s(path("dangling.bin")); },
               {"data file " + path("dangling.bin") + " is a symlink to " + path("nowhere.bin") + ", which does not exist"});
  fs::create_directory(path("dir.bin"));
  expect_error([&] { zt::TokenShard s(path("dir.bin")); }, {"data file " + path("dir.bin") + " is a directory, not a regular file"});
}

TEST_F(DataTest, TokenizerErrors) {
  expect_error([&] { zt::Tokenizer t(path("none.bin")); }, {path("none.bin"), "cannot open"});
  write_raw(path("bad.bin"), {20240520, 1, 3}, 6);  // a token shard, not a tokenizer
  expect_error([&] { zt::Tokenizer t(path("bad.bin")); }, {path("bad.bin"), "bad magic 20240520", "20240328"});
  write_raw(path("short.bin"), {20240328, 2, 3, 2}, 0);
  expect_error([&] { zt::Tokenizer t(path("short.bin")); }, {path("short.bin"), "truncated"});
  write_raw(path("ok.bin"), {20240328, 2, 3, 2}, 0);
  {
    std::ofstream f(path("ok.bin"), std::ios::binary | std::ios::app);
    f << '\x01' << 'a' << '\x02' << "bc" << '\x05' << "<eot>";
  }
  zt::Tokenizer t(path("ok.bin"));
  EXPECT_EQ(t.vocab_size(), 3);
  EXPECT_EQ(t.eot(), 2);
  EXPECT_EQ(t.decode(std::vector<int>{0, 1, 2}), "abc<eot>");
}

// The committed sample is a prefix of the prepared Brown data: documents start with end-of-text.
TEST(SampleData, ShardsDecodeToBrownText) {
  const std::string dir = std::string(ZT_SOURCE_DIR) + "/data/sample/";
  zt::TokenShard train(dir + "train_000.bin"), val(dir + "val.bin");
  EXPECT_GE(train.size(), 32768u);
  EXPECT_GE(val.size(), 4096u);
  EXPECT_EQ(train.tokens()[0], 50256);
  EXPECT_EQ(val.tokens()[0], 50256);
  zt::Tokenizer tok(kSampleTokenizer);
  std::vector<int> head(train.tokens() + 1, train.tokens() + 9);
  EXPECT_EQ(tok.decode(head).rfind("The Fulton County Grand Jury", 0), 0u) << tok.decode(head);
  for (size_t i = 0; i < train.size(); ++i) ASSERT_LT(train.tokens()[i], 50257) << "token " << i;
}
