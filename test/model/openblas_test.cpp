// Which OpenBLAS kernel runs. The ctest unit_openblas_haswell (test/tests.cmake) runs this binary
// again with OPENBLAS_CORETYPE=Haswell, so that a claim of equal bits that holds on one kernel only
// fails in CI whatever machine CI gets; this test says whether the library honoured the variable (a
// DYNAMIC_ARCH build such as Debian's does, one built for a single target ignores it), and
// test/model/openblas_kernel.sh reports Skipped, never Passed, where it did not.
#include <cblas.h>
#include <gtest/gtest.h>
#include <strings.h>

#include <cstdlib>

namespace {

TEST(OpenBlas, RunsTheKernelAsked) {
  const char* asked = std::getenv("OPENBLAS_CORETYPE");
  const char* core = openblas_get_corename();
  if (!asked || !*asked) GTEST_SKIP() << "OPENBLAS_CORETYPE unset; OpenBLAS runs " << core;
  EXPECT_EQ(0, strcasecmp(asked, core))
      << "OPENBLAS_CORETYPE=" << asked << " but OpenBLAS runs " << core << " (" << openblas_get_config() << ")";
}

}  // namespace
