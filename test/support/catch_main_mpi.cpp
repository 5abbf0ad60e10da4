// Catch2 main for tests run under mpiexec: MPI is initialised around the
// session, and the exit status is the worst over all ranks so that one failing
// rank fails the test.  Exit code 77 from every rank means "skipped".
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failed = Catch::Session().run(argc, argv);
  int local = failed != 0 ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
