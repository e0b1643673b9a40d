! A Fortran MPI program that embeds a relaymoe layer, as examples/embed does in
! C: it initialises MPI itself (mpi_f08, MPI_THREAD_MULTIPLE), hands
! MPI_COMM_WORLD to relaymoe, runs the layer forward and backward with the ring
! and with all-to-all, and checks y, dx, the router gradient (summed over
! ranks) and the gradients of the experts each rank owns against its own
! double-precision implementation (reference.f90). Exits non-zero past a
! relative error of 1e-5.
!
! Arrays are in the relaymoe module's layout: the library's row-major C
! shapes reversed (x(hidden, tokens), w_router(experts, hidden), ...).
program embed
  use, intrinsic :: iso_c_binding, only: c_float, c_int
  use, intrinsic :: iso_fortran_env, only: real64, int64, error_unit
  use mpi_f08
  use relaymoe
  use relaymoe_mpi
  use embed_reference
  implicit none

  integer, parameter :: HIDDEN = 64, FFN = 32, EXPERTS = 8, TOPK = 2, TOKENS = 96
  real(c_float) :: w_router(EXPERTS, HIDDEN), w_gate(FFN, HIDDEN, EXPERTS), w_up(FFN, HIDDEN, EXPERTS), &
    w_down(HIDDEN, FFN, EXPERTS)
  real(c_float), allocatable :: x_all(:, :), dy_all(:, :)
  real(c_float) :: x(HIDDEN, TOKENS), dy(HIDDEN, TOKENS), y(HIDDEN, TOKENS), dx(HIDDEN, TOKENS), &
    dw_router(EXPERTS, HIDDEN)
  real(c_float) :: dw_gate(FFN, HIDDEN), dw_up(FFN, HIDDEN), dw_down(HIDDEN, FFN)
  real(real64), allocatable :: ry(:, :), rdx(:, :)
  real(real64) :: rdw_router(EXPERTS, HIDDEN), rdw_gate(FFN, HIDDEN, EXPERTS), rdw_up(FFN, HIDDEN, EXPERTS), &
    rdw_down(HIDDEN, FFN, EXPERTS)
  ! Per check, the squared norms of the difference and of the reference.
  real(real64) :: sums(2, 5), total(2, 5)
  integer(int64) :: seed
  type(rmoe_ctx) :: ctx
  type(rmoe_layer) :: layer
  type(rmoe_layer_config) :: cfg
  integer :: provided, rank, nranks, i, e, first, count, run
  integer(c_int) :: rc
  integer(c_int), parameter :: dispatches(2) = [RMOE_DISPATCH_RING_EXPERT, RMOE_DISPATCH_ALLTOALL]
  character(len=*), parameter :: names(4) = [character(len=9) :: 'y', 'dx', 'dw_router', 'dw_expert']
  real(real64) :: errors(4)
  logical :: ok, passed

  call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks)
  rc = rmoe_ctx_create_comm(ctx, MPI_COMM_WORLD)
  if (rc /= 0) then
    write(error_unit, '(a)') 'embed: ' // rmoe_strerror(rc)
    call MPI_Abort(MPI_COMM_WORLD, 1)
  end if

  ! The same weights and the same batch of every rank's tokens on all ranks;
  ! each rank runs its own columns.
  seed = 42
  call draw(w_router, seed, 0.125)
  do e = 1, EXPERTS
    call draw(w_gate(:, :, e), seed, 0.125)
    call draw(w_up(:, :, e), seed, 0.125)
    call draw(w_down(:, :, e), seed, 0.18)
  end do
  allocate(x_all(HIDDEN, TOKENS * nranks), dy_all(HIDDEN, TOKENS * nranks), ry(HIDDEN, TOKENS * nranks), &
           rdx(HIDDEN, TOKENS * nranks))
  call draw(x_all, seed, 1.0)
  call draw(dy_all, seed, 1.0)
  x = x_all(:, rank * TOKENS + 1:(rank + 1) * TOKENS)
  dy = dy_all(:, rank * TOKENS + 1:(rank + 1) * TOKENS)
  call moe_reference(real(x_all, real64), real(dy_all, real64), real(w_router, real64), &
                     real(w_gate, real64), real(w_up, real64), real(w_down, real64), TOPK, &
                     ry, rdx, rdw_router, rdw_gate, rdw_up, rdw_down)

  ok = .true.
  do run = 1, 2
    call rmoe_layer_config_init(cfg)
    cfg%hidden = HIDDEN
    cfg%ffn = FFN
    cfg%experts = EXPERTS
    cfg%topk = TOPK
    cfg%tokens = TOKENS
    cfg%dispatch = dispatches(run)
    rc = rmoe_layer_create(layer, ctx, cfg)
    if (rc == 0) rc = rmoe_layer_set_router(layer, w_router)
    if (rc == 0) rc = rmoe_layer_owned_experts(layer, first, count)
    ! Experts are numbered from 0 in the library: expert e is column e+1 here.
    do e = first, first + count - 1
      if (rc == 0) rc = rmoe_layer_set_expert(layer, e, w_gate(:, :, e + 1), w_up(:, :, e + 1), &
                                              w_down(:, :, e + 1))
    end do
    if (rc == 0) rc = rmoe_layer_forward(layer, x, y)
    if (rc == 0) rc = rmoe_layer_backward(layer, dy, dx)
    if (rc == 0) rc = rmoe_layer_get_grad_router(layer, dw_router)
    sums = 0
    if (rc == 0) then
      call accumulate(sums(:, 1), y, ry(:, rank * TOKENS + 1:(rank + 1) * TOKENS))
      call accumulate(sums(:, 2), dx, rdx(:, rank * TOKENS + 1:(rank + 1) * TOKENS))
    end if
    ! The router's gradient is each rank's part: summed over ranks here.
    if (rc == 0) call MPI_Allreduce(MPI_IN_PLACE, dw_router, EXPERTS * HIDDEN, MPI_REAL, MPI_SUM, &
                                    MPI_COMM_WORLD)
    if (rc == 0 .and. rank == 0) call accumulate(sums(:, 3), dw_router, rdw_router)
    do e = first, first + count - 1
      if (rc == 0) rc = rmoe_layer_get_grad_expert(layer, e, dw_gate, dw_up, dw_down)
      if (rc == 0) then
        call accumulate(sums(:, 4), dw_gate, rdw_gate(:, :, e + 1))
        call accumulate(sums(:, 4), dw_up, rdw_up(:, :, e + 1))
        call accumulate(sums(:, 4), dw_down, rdw_down(:, :, e + 1))
      end if
    end do
    if (rc /= 0) write(error_unit, '(a)') 'embed: ' // rmoe_strerror(rc)
    sums(1, 5) = merge(1d0, 0d0, rc /= 0)
    i = rmoe_layer_destroy(layer)

    ! The program's own MPI traffic goes on beside relaymoe's.
    call MPI_Allreduce(sums, total, 10, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
    errors = sqrt(total(1, 1:4) / total(2, 1:4))
    passed = total(1, 5) < 0.5d0 .and. all(errors <= 1d-5)  ! total(1, 5): ranks that failed
    if (rank == 0) write(*, '(a, i0, 3a, 4(1x, a, es9.2), a, a)') 'embed.f90: ', nranks, ' ranks, ', &
      rmoe_dispatch_name(dispatches(run)), ', relative error', (trim(names(i)), errors(i), i = 1, 4), &
      ' (tolerance 1e-5): ', trim(merge('ok    ', 'FAILED', passed))
    ok = ok .and. passed
  end do

  rc = rmoe_ctx_destroy(ctx)
  call MPI_Finalize()
  if (.not. ok .or. rc /= 0) error stop 1

contains

  ! Uniform in [-scale, scale) from a Park-Miller sequence: the same numbers
  ! on every rank and compiler.
  subroutine draw(a, s, scale)
    real(c_float), intent(out) :: a(:, :)
    integer(int64), intent(inout) :: s
    real, intent(in) :: scale
    integer :: i, j
    do j = 1, size(a, 2)
      do i = 1, size(a, 1)
        s = mod(s * 48271_int64, 2147483647_int64)
        a(i, j) = real((real(s, real64) / 2147483647d0 * 2 - 1) * scale, c_float)
      end do
    end do
  end subroutine

  subroutine accumulate(s, got, want)
    real(real64), intent(inout) :: s(2)
    real(c_float), intent(in) :: got(:, :)
    real(real64), intent(in) :: want(:, :)
    s(1) = s(1) + sum((real(got, real64) - want)**2)
    s(2) = s(2) + sum(want**2)
  end subroutine

end program embed
