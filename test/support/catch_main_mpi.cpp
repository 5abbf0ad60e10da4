// Catch2 main for tests run under mpiexec: MPI is initialised around the
// session, and the exit status is the worst over all ranks so that one failing
// rank fails the test.  Exit code 77 from every rank means "skipped": a case
// was skipped on some rank and none failed on any (case_skip.hpp).
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include "mpi_session.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  return moe_ep_test::run_session_on_every_rank(argc, argv);
}
