! The one part of the relaymoe Fortran interface that takes an MPI type, as
! relaymoe_mpi.h is for C: the context over an mpi_f08 communicator.
module relaymoe_mpi
  use, intrinsic :: iso_c_binding, only: c_int
  use mpi_f08, only: MPI_Comm
  use relaymoe, only: rmoe_ctx, rmoe_ctx_config, rmoe_ctx_create_fcomm
  implicit none
  private
  public :: rmoe_ctx_create_comm

contains

  !> As rmoe_ctx_create, over comm (the expert-parallel group). MPI must be
  !> initialised with MPI_THREAD_MULTIPLE (MPI_Init_thread). If the program
  !> already runs StarPU-MPI, comm must be the communicator it was started
  !> with. Collective.
  function rmoe_ctx_create_comm(ctx, comm, cfg, sched, cluster_file, trace) result(rc)
    type(rmoe_ctx), intent(inout) :: ctx
    type(MPI_Comm), intent(in) :: comm
    type(rmoe_ctx_config), intent(in), optional :: cfg
    character(len=*), intent(in), optional :: sched, cluster_file, trace
    integer(c_int) :: rc
    ! The mpi_f08 handle's MPI_VAL is the Fortran handle (MPI-3.0 §17.2.5).
    rc = rmoe_ctx_create_fcomm(ctx, comm%MPI_VAL, cfg, sched, cluster_file, trace)
  end function

end module relaymoe_mpi
