// Checkpoint pieces below the trainer (docs/design.md §3.7): the CRC-32C against its standard test
// vector and a bitwise reference, and the reader refusing rank files that do not cover a tensor
// exactly. The end-to-end behaviour (resume, reshard, model.h5, export, faults) is
// test/checkpoint/checkpoint_test.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "checkpoint/crc32c.h"
#include "checkpoint/format.h"
#include "checkpoint/rank_file.h"
#include "checkpoint/reader.h"
#include "model/layout.h"
#include "temp_dir.h"

namespace {

uint32_t crc32c_bitwise(const unsigned char* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(Crc32c, StandardVectorReferenceAndContinuation) {
  EXPECT_EQ(zt::crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  std::vector<unsigned char> buf(100003);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  const uint32_t whole = zt::crc32c(buf.data(), buf.size());
  EXPECT_EQ(whole, crc32c_bitwise(buf.data(), buf.size()));
  EXPECT_EQ(zt::crc32c(buf.data() + 777, buf.size() - 777, zt::crc32c(buf.data(), 777)), whole);
  buf[5000] ^= 4;
  EXPECT_NE(zt::crc32c(buf.data(), buf.size()), whole);
}

// The SSE4.2 path checksums three 8 KiB lanes at once and joins them: every length around the lane
// blocks (one block less a byte, one, one plus a byte, several, from unaligned starts) and every
// continuation point matches the bitwise reference.
TEST(Crc32c, LanesJoinedMatchTheReference) {
  std::vector<unsigned char> buf(5 * 3 * 8192 + 100);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>((i * 40503u) >> 7 ^ i);
  for (size_t start : {0, 1, 5})
    for (size_t n : {3 * 8192 - 1, 3 * 8192, 3 * 8192 + 1, 2 * 3 * 8192 + 17, 5 * 3 * 8192 + 95}) {
      const unsigned char* p = buf.data() + start;
      const uint32_t want = crc32c_bitwise(p, n);
      EXPECT_EQ(zt::crc32c(p, n), want) << "start " << start << ", " << n << " bytes";
      for (size_t cut : {size_t(1), size_t(8192), n / 2, n - 3})
        EXPECT_EQ(zt::crc32c(p + cut, n - cut, zt::crc32c(p, cut)), want) << "cut at " << cut << " of " << n;
    }
}

class CheckpointReaderTest : public TempDirTest {
 protected:
  CheckpointReaderTest() : TempDirTest("zt_ckpt") {}
  // Two rank files holding wpe of a tiny model in the given (rank, offset, count) pieces.
  void write(const std::vector<std::array<size_t, 3>>& pieces, int64_t step = 0, int world = 2) {
    zt::ckpt::Meta m;
    m.step = step;
    m.world = world;
    m.model = cfg_;
    const zt::TensorSlot& wpe = layout_.slot(zt::ParamId::wpe);
    std::vector<float> v(wpe.numel);
    std::iota(v.begin(), v.end(), 0.0f);
    for (int r = 0; r < world; ++r) {
      m.rank = r;
      zt::ckpt::RankFileWriter w(path(zt::ckpt::rank_file_name(r)), m);
      for (const auto& p : pieces)
        if (p[0] == size_t(r)) w.add(zt::ckpt::Kind::param, zt::DType::f32, wpe, p[1], p[2], v.data() + p[1]);
      w.finish();
    }
  }
  zt::GPTConfig cfg_ = zt::GPTConfig::make(1, 2, 8, 5, 100);  // wpe: 5 x 8 = 40 elements
  zt::ParamLayout layout_{cfg_, 1};
};

TEST_F(CheckpointReaderTest, ReadsAcrossRankFilesByOffset) {
  write({{0, 0, 13}, {1, 13, 27}});
  zt::ckpt::CheckpointReader rd(dir_.string());
  std::vector<float> got(20);
  rd.read(zt::ckpt::Kind::param, layout_.slot(zt::ParamId::wpe), 5, 20, got.data());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], float(5 + i));
}

TEST_F(CheckpointReaderTest, RefusesMissingAndOverlappingElements) {
  write({{0, 0, 13}, {1, 14, 26}});
  {
    zt::ckpt::CheckpointReader rd(dir_.string());
    try {
      rd.pieces(zt::ckpt::Kind::param, layout_.slot(zt::ParamId::wpe));
      FAIL() << "a gap was accepted";
    } catch (const zt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("wpe.weight: elements missing from 13"), std::string::npos) << e.what();
    }
  }
  write({{0, 0, 20}, {1, 13, 27}});
  zt::ckpt::CheckpointReader rd(dir_.string());
  try {
    rd.pieces(zt::ckpt::Kind::param, layout_.slot(zt::ParamId::wpe));
    FAIL() << "an overlap was accepted";
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlapping datasets at 20"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointReaderTest, RefusesAMissingRankFile) {
  write({{0, 0, 13}, {1, 13, 27}});
  std::filesystem::remove(path(zt::ckpt::rank_file_name(1)));
  try {
    zt::ckpt::CheckpointReader rd(dir_.string());
    FAIL() << "an incomplete checkpoint was opened";
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank_00001.h5 is missing"), std::string::npos) << e.what();
  }
}

// Checked before anything is read: a rank file of another save (another step, or another world
// whose rank 0 would not even list it) is named as such, not found later as a wrong batch size.
TEST_F(CheckpointReaderTest, RefusesRankFilesFromDifferentSaves) {
  namespace fs = std::filesystem;
  const fs::path other = dir_.string() + "_other";
  fs::create_directories(other);
  write({{0, 0, 40}}, 5, 1);  // world 1, step 5
  fs::copy_file(path(zt::ckpt::rank_file_name(0)), other / "world1_rank0.h5");
  write({{0, 0, 13}, {1, 13, 27}}, 5, 2);  // world 2, step 5
  fs::copy_file(path(zt::ckpt::rank_file_name(1)), other / "step5_rank1.h5");
  const auto ow = fs::copy_options::overwrite_existing;
  for (const char* which : {"another step", "another world"}) {
    write({{0, 0, 13}, {1, 13, 27}}, 7, 2);  // world 2, step 7 ...
    if (std::string(which) == "another step")  // ... with rank 1 of step 5
      fs::copy_file(other / "step5_rank1.h5", path(zt::ckpt::rank_file_name(1)), ow);
    else  // ... with rank 0 of a world-1 save, which alone would list no rank 1
      fs::copy_file(other / "world1_rank0.h5", path(zt::ckpt::rank_file_name(0)), ow);
    try {
      zt::ckpt::CheckpointReader rd(dir_.string());
      FAIL() << which << ": mixed rank files were opened";
    } catch (const zt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank files from different saves"), std::string::npos) << which << ": " << e.what();
    }
  }
  fs::remove_all(other);
}

}  // namespace
