// Catch2 main for tests run under mpiexec: MPI is initialised around the
// session, and the exit status is the worst over all ranks so that one failing
// rank fails the test.  Exit code 77 from every rank means "skipped": a case
// was skipped on some rank and none failed on any (case_skip.hpp).
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>

#include "case_skip.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int failed = Catch::Session().run(argc, argv);
  int local[2] = {failed != 0 ? 1 : 0, moe_ep_test::skipped_cases() > 0 ? 1 : 0};
  int any[2] = {0, 0};
  MPI_Allreduce(local, any, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return moe_ep_test::test_exit_code(any[0] != 0, any[1] != 0);
}
