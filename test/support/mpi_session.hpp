// The Catch2 session of a test run under mpiexec, for its main (after
// MPI_Init): the exit status is the worst over all ranks, so that one failing
// rank fails the test, and 77 ("skipped") only when a case was skipped on some
// rank and none failed on any (case_skip.hpp).  Finalizes MPI.
#pragma once

#include <mpi.h>

#include <catch2/catch.hpp>

#include "case_skip.hpp"

namespace moe_ep_test {

inline int run_session_on_every_rank(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  int local[2] = {failed != 0 ? 1 : 0, skipped_cases() > 0 ? 1 : 0};
  int any[2] = {0, 0};
  MPI_Allreduce(local, any, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return test_exit_code(any[0] != 0, any[1] != 0);
}

}  // namespace moe_ep_test
