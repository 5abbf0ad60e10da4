/* An MPI program written the way an outside user of the installed adapter
 * would: <mpi.h> and <moe_ep_mpi.h>, built with the CMake package only.  It
 * checks that the adapter it loaded lives under the install prefix given as
 * argv[1], and that it fills a bootstrap from MPI_COMM_WORLD and releases it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include <moe_ep_mpi.h>

#define EXPECT(cond)                                          \
  do {                                                        \
    if (!(cond)) {                                            \
      fprintf(stderr, "FAIL line %d: %s\n", __LINE__, #cond); \
      return 1;                                               \
    }                                                         \
  } while (0)

int main(int argc, char** argv) {
  EXPECT(argc == 2);
  MPI_Init(&argc, &argv);
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  Dl_info info;
  EXPECT(dladdr((void*)&moe_ep_mpi_bootstrap_init, &info) != 0 && info.dli_fname != NULL);
  if (strncmp(info.dli_fname, argv[1], strlen(argv[1])) != 0) {
    fprintf(stderr, "FAIL: libmoe_ep_mpi loaded from %s, expected under %s\n", info.dli_fname, argv[1]);
    return 1;
  }

  MPI_Comm world = MPI_COMM_WORLD;
  moe_ep_bootstrap_t boot;
  memset(&boot, 0, sizeof boot);
  const moe_ep_status_t s = moe_ep_mpi_bootstrap_init(&world, &boot, sizeof boot);
  if (s != MOE_EP_SUCCESS) {
    fprintf(stderr, "FAIL moe_ep_mpi_bootstrap_init: %s: %s\n", moe_ep_status_string(s), moe_ep_last_error());
    return 1;
  }
  EXPECT(boot.rank == rank && boot.world_size == size);
  EXPECT(boot.allgather != NULL && boot.barrier != NULL);
  EXPECT(moe_ep_mpi_bootstrap_release(&boot) == MOE_EP_SUCCESS);
  MPI_Finalize();
  if (rank == 0) printf("OK: moe_ep_mpi from %s, %d rank(s)\n", info.dli_fname, size);
  return 0;
}
