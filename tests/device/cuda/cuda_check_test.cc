// CUDA_CHECK, CUDNN_CHECK and CUBLAS_CHECK: the thrown LibraryError names the library, the call,
// the file and the library's own message, and the checked expression runs once. No GPU needed.
#include <cublas_v2.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "device/cuda/cuda_check.h"

namespace ferry {
namespace {

cudaError_t returns(cudaError_t status) { return status; }

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CudaCheck, SuccessDoesNotThrow) {
  EXPECT_NO_THROW(CUDA_CHECK(returns(cudaSuccess)));
  EXPECT_NO_THROW(CUDNN_CHECK(CUDNN_STATUS_SUCCESS));
  EXPECT_NO_THROW(CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
}

TEST(CudaCheck, FailureThrowsLibraryErrorWithCallFileAndMessage) {
  try {
    CUDA_CHECK(returns(cudaErrorInvalidValue));
    FAIL() << "CUDA_CHECK did not throw";
  } catch (const LibraryError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.library(), "CUDA");
    EXPECT_TRUE(contains(what, "returns(cudaErrorInvalidValue)")) << what;
    EXPECT_TRUE(contains(what, "cudaErrorInvalidValue: invalid argument")) << what;
    EXPECT_TRUE(contains(what, "cuda_check_test.cc:")) << what;
  }
}

TEST(CudaCheck, EvaluatesTheExpressionOnce) {
  int calls = 0;
  auto failing = [&] {
    ++calls;
    return cudaErrorMemoryAllocation;
  };
  EXPECT_THROW(CUDA_CHECK(failing()), LibraryError);
  EXPECT_EQ(calls, 1);
  EXPECT_NO_THROW(CUDA_CHECK((++calls, cudaSuccess)));
  EXPECT_EQ(calls, 2);
}

TEST(CudaCheck, CudnnStatusIsNamed) {
  try {
    CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM);
    FAIL() << "CUDNN_CHECK did not throw";
  } catch (const LibraryError& e) {
    EXPECT_EQ(e.library(), "cuDNN");
    EXPECT_TRUE(contains(e.what(), "CUDNN_STATUS_BAD_PARAM")) << e.what();
  }
}

TEST(CudaCheck, CublasStatusIsNamedAndDescribed) {
  try {
    CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE);
    FAIL() << "CUBLAS_CHECK did not throw";
  } catch (const LibraryError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.library(), "cuBLAS");
    EXPECT_TRUE(contains(what, "CUBLAS_STATUS_INVALID_VALUE: ")) << what;
    // The description follows the name.
    EXPECT_GT(what.size(), what.find("CUBLAS_STATUS_INVALID_VALUE: ") + 30) << what;
  }
}

}  // namespace
}  // namespace ferry
