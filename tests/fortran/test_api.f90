! The Fortran interface beyond the example, under mpiexec at 1 and 2 ranks,
! with the classic `use mpi` handle (rmoe_ctx_create_fcomm): configuration
! defaults, shapes checked against the layer (an array in the C orientation
! refused, naming it, on every rank alike, and the layer still usable), a
! non-contiguous section copied in by the compiler, the library's own error
! messages, a non-finite input, a shared expert, a destroyed layer and
! context, ring order, routing, stats and dispatch names, token counts that
! differ between the ranks and change per call (none on rank 0, more than
! the capacity on the last rank). Prints one line per failed check; exit 1
! on any.
program test_api
  use, intrinsic :: iso_c_binding
  use, intrinsic :: ieee_arithmetic, only: ieee_value, ieee_quiet_nan
  use mpi
  use relaymoe
  implicit none
  integer, parameter :: nh = 64, nf = 32, ne = 8, nk = 2, nt = 96
  integer :: ierr, provided, rank, nranks, failures, all_failures, first, count, e, other, i
  integer(c_int) :: rc, d
  type(rmoe_ctx) :: ctx
  type(rmoe_layer) :: layer, shared
  type(rmoe_layer_config) :: cfg
  type(rmoe_layer_stats) :: stats
  real(c_float) :: w_router(ne, nh), w_wrong(nh, ne), g(nf, nh), u(nf, nh), dn(nh, nf)
  real(c_float) :: x(nh, nt), dy(nh, nt), y(nh, nt), y2(nh, nt), dx(nh, nt), x_c(nt, nh), wide(nh, 2 * nt)
  real(c_float) :: dprobs_wrong(nt, ne), x_nan(nh, nt), sg(16, nh), su(16, nh), sd(nh, 16)
  real(c_float) :: sgate(nh), sgate_back(nh), sgate_bad(5)
  integer(c_int32_t) :: idx(nk, nt)
  integer(c_int), allocatable :: order(:)
  real(c_float), allocatable :: xs(:, :), ys(:, :), dxs(:, :), dys(:, :)
  integer(c_int32_t), allocatable :: idxs(:, :)
  integer :: n, step

  call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided, ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  failures = 0

  rc = rmoe_ctx_create_fcomm(ctx, MPI_COMM_WORLD)
  call expect(rc == 0, 'rmoe_ctx_create_fcomm over the classic MPI_COMM_WORLD', rc)
  if (rc /= 0) call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  call expect(rmoe_ctx_rank(ctx) == rank .and. rmoe_ctx_size(ctx) == nranks, 'rank and size as MPI''s', 0)
  allocate(order(nranks + 1))
  call expect_error(rmoe_ctx_ring_order(ctx, order), RMOE_EINVAL, 'order has', 'ring order, too many entries')
  deallocate(order)
  allocate(order(nranks))
  rc = rmoe_ctx_ring_order(ctx, order)
  call expect(rc == 0 .and. all([(any(order == i), i = 0, nranks - 1)]), 'ring order: every rank once', rc)

  call rmoe_layer_config_init(cfg)
  call expect(cfg%hidden == 128 .and. cfg%ffn == 48 .and. cfg%experts == 128 .and. cfg%topk == 8 .and. &
              cfg%norm_topk == 1 .and. cfg%dispatch == RMOE_DISPATCH_RING_EXPERT .and. cfg%overlap == 1, &
              'rmoe_layer_config_init defaults', 0)
  cfg%hidden = nh
  cfg%ffn = nf
  cfg%experts = ne
  cfg%tokens = nt
  cfg%deterministic = 1
  cfg%topk = ne + 1
  ! The library's check and sentence, on every rank.
  call expect_error(rmoe_layer_create(layer, ctx, cfg), RMOE_EINVAL, 'topk = 9', 'topk > experts refused')
  cfg%topk = nk
  rc = rmoe_layer_create(layer, ctx, cfg)
  call expect(rc == 0, 'rmoe_layer_create', rc)
  if (rc /= 0) call MPI_Abort(MPI_COMM_WORLD, 1, ierr)

  call fill(w_router, 0.3, 0.125)
  call fill(w_wrong, 0.3, 0.125)
  call expect_error(rmoe_layer_set_router(layer, w_wrong), RMOE_EINVAL, &
                    'w_router is (64, 8): expected (experts=8, hidden=64)', 'router in the C orientation')
  call expect(rmoe_layer_set_router(layer, w_router) == 0, 'rmoe_layer_set_router', 0)
  rc = rmoe_layer_owned_experts(layer, first, count)
  call expect(rc == 0 .and. first == rank * (ne / nranks) .and. count == ne / nranks, 'owned experts', rc)
  do e = first, first + count - 1
    call fill(g, 1.1 + e, 0.125)
    call fill(u, 2.3 + e, 0.125)
    call fill(dn, 3.7 + e, 0.18)
    rc = rmoe_layer_set_expert(layer, e, g, u, dn)
    call expect(rc == 0, 'rmoe_layer_set_expert', rc)
  end do
  call expect_error(rmoe_layer_set_expert(layer, first, g, u, g), RMOE_EINVAL, &
                    'w_down is (32, 64): expected (hidden=64, ffn=32)', 'w_down in the C orientation')
  other = mod(first + count, ne)
  if (nranks == 1) other = ne
  call expect_error(rmoe_layer_get_expert(layer, other, g, u, dn), RMOE_EINVAL, 'is not owned', &
                    'an expert of another rank: the library''s message')

  call fill(x, 4.1, 1.0)
  call fill(dprobs_wrong, 6.7, 1.0)
  call fill(dy, 5.3, 1.0)
  x_c = transpose(x)
  call expect_error(rmoe_layer_forward(layer, x_c, y), RMOE_EINVAL, &
                    'x is (96, 64): expected (hidden=64, tokens=96)', 'x in the C orientation')
  rc = rmoe_layer_forward(layer, x, y)
  call expect(rc == 0 .and. sum(abs(y)) > 0, 'forward after the refused one', rc)
  ! Every other column of wide: a non-contiguous section, copied in.
  wide = 0
  wide(:, 1:2 * nt:2) = x
  rc = rmoe_layer_forward(layer, wide(:, 1:2 * nt:2), y2)
  call expect(rc == 0 .and. maxval(abs(y2 - y)) <= 0, &
              'non-contiguous x: the same y, bit for bit (deterministic)', rc)
  call expect_error(rmoe_layer_backward(layer, dy, dx, dprobs_wrong), RMOE_EINVAL, &
                    'dprobs is (96, 8): expected (experts=8, tokens=96)', 'dprobs in the C orientation')
  rc = rmoe_layer_backward(layer, dy, dx)
  call expect(rc == 0 .and. sum(abs(dx)) > 0, 'backward after the refused one', rc)
  rc = rmoe_layer_get_routing(layer, topk_idx=idx)
  call expect(rc == 0 .and. all(idx >= 0 .and. idx < ne), 'routing indices 0-based', rc)
  rc = rmoe_layer_get_stats(layer, stats)
  call expect(rc == 0 .and. stats%hops == nranks .and. stats%forward_seconds > 0, 'stats', rc)
  call expect(rmoe_dispatch_name(rmoe_layer_dispatch(layer)) == 'ring', 'dispatch name', 0)
  rc = rmoe_dispatch_parse('token', d)
  call expect(rc == 0 .and. d == RMOE_DISPATCH_RING_TOKEN, 'rmoe_dispatch_parse', rc)
  call expect_error(rmoe_dispatch_parse('rings', d), RMOE_EINVAL, 'dispatch ''rings''', 'unknown dispatch')

  ! Token counts. Until set, the count is cfg%tokens.
  call expect(rmoe_layer_tokens(layer) == nt .and. layer%tokens == nt .and. layer%capacity == nt, &
              'rmoe_layer_tokens: the capacity until set', 0)
  call expect_error(rmoe_layer_set_tokens(layer, -1), RMOE_EINVAL, 'tokens = -1', 'a negative count')
  call expect(rmoe_layer_tokens(layer) == nt, 'a refused count leaves the count', 0)
  rc = rmoe_layer_set_tokens(layer, 5)
  call expect(rc == 0 .and. rmoe_layer_tokens(layer) == 5 .and. layer%tokens == 5, 'rmoe_layer_set_tokens', rc)
  call expect_error(rmoe_layer_forward(layer, x, y), RMOE_EINVAL, 'x is (64, 96): expected (hidden=64, tokens=5)', &
                    'x of the capacity once 5 tokens are set')
  ! Per call, each rank's count: the first n columns of x, whose outputs
  ! are y's first n columns (a token's output is its own). None on rank 0,
  ! then more than the capacity on the last rank (grown on every rank),
  ! then the capacity again.
  do step = 1, 3
    select case (step)
    case (1)
      n = merge(0, 17 + rank, rank == 0)
    case (2)
      n = merge(nt + 7, 40 - rank, rank == nranks - 1)
    case default
      n = nt
    end select
    ! dys has a column more than the count: refused as dy on every rank.
    allocate(xs(nh, n), ys(nh, n), dxs(nh, n), dys(nh, n + 1), idxs(nk, n))
    call fill(xs, 4.1, 1.0)
    if (n <= nt) xs = x(:, 1:n)
    rc = rmoe_layer_set_tokens(layer, n)
    if (rc == 0) rc = rmoe_layer_forward(layer, xs, ys)
    call expect(rc == 0 .and. layer%forward_tokens == n, 'forward of this rank''s count', rc)
    if (n > 0 .and. n <= nt) call expect(maxval(abs(ys - y(:, 1:n))) <= 1e-5 * maxval(abs(y)), &
                                         'a count''s y: the first columns of the full y', 0)
    call fill(dys, 5.3, 1.0)
    call expect_error(rmoe_layer_backward(layer, dys, dxs), RMOE_EINVAL, 'expected (hidden=64, tokens=' // &
                      itoa(n) // ')', 'dy of another count than the forward''s')
    rc = rmoe_layer_backward(layer, dys(:, 1:n), dxs)
    call expect(rc == 0 .and. (n == 0 .or. sum(abs(dxs)) > 0), 'backward of this rank''s count', rc)
    rc = rmoe_layer_get_routing(layer, topk_idx=idxs)
    call expect(rc == 0 .and. all(idxs >= 0 .and. idxs < ne), 'routing of this rank''s count', rc)
    deallocate(xs, ys, dxs, dys, idxs)
  end do
  rc = rmoe_layer_set_tokens(layer, nt)
  call expect(rc == 0, 'back to the capacity', rc)

  ! C's indices [t, h] in the library's message: x(6, 4) is x[3, 5].
  x_nan = x
  x_nan(6, 4) = ieee_value(x_nan(6, 4), ieee_quiet_nan)
  call expect_error(rmoe_layer_check_finite(layer, x=x_nan), RMOE_ENONFINITE, 'x[3, 5] = nan', &
                    'NaN found by rmoe_layer_check_finite')

  cfg%shared_ffn = 16
  rc = rmoe_layer_create(shared, ctx, cfg)
  call expect(rc == 0, 'a layer with a shared expert', rc)
  call fill_shared(sg, su, sd)
  call expect_error(rmoe_layer_set_shared(shared, sg, su, sg), RMOE_EINVAL, &
                    'w_down is (16, 64): expected (hidden=64, shared_ffn=16)', &
                    'shared w_down in the C orientation')
  call expect(rmoe_layer_set_shared(shared, sg, su, sd) == 0, 'rmoe_layer_set_shared', 0)
  rc = rmoe_layer_forward(shared, x, y2)
  if (rc == 0) rc = rmoe_layer_backward(shared, dy, dx)
  if (rc == 0) rc = rmoe_layer_get_grad_shared(shared, sg, su, sd)
  call expect(rc == 0 .and. sum(abs(sd)) > 0, 'shared expert forward, backward, gradient', rc)
  sgate = [(0.125 * sin(1.3 + real(i)), i = 1, nh)]
  call expect_error(rmoe_layer_set_shared_expert_gate(shared, sgate), RMOE_ESTATE, 'not gated', &
                    'a gate on an ungated shared expert')
  call expect(rmoe_layer_destroy(shared) == 0, 'rmoe_layer_destroy (shared)', 0)

  ! Qwen2-MoE's gated shared expert: the gate (hidden) set, read back, its gradient.
  cfg%shared_gated = 1
  rc = rmoe_layer_create(shared, ctx, cfg)
  call expect(rc == 0, 'a layer with a gated shared expert', rc)
  call fill_shared(sg, su, sd)
  call expect(rmoe_layer_set_shared(shared, sg, su, sd) == 0, 'rmoe_layer_set_shared (gated)', 0)
  sgate_bad = 1
  call expect_error(rmoe_layer_set_shared_expert_gate(shared, sgate_bad), RMOE_EINVAL, &
                    'has 5 elements: expected hidden=64', 'a gate of the wrong size')
  call expect_error(rmoe_layer_forward(shared, x, y2), RMOE_ESTATE, 'no shared expert gate was set', &
                    'a gated forward before the gate is set')
  call expect(rmoe_layer_set_shared_expert_gate(shared, sgate) == 0, 'rmoe_layer_set_shared_expert_gate', 0)
  rc = rmoe_layer_get_shared_expert_gate(shared, sgate_back)
  call expect(rc == 0 .and. all(sgate_back == sgate), 'rmoe_layer_get_shared_expert_gate reads it back', rc)
  rc = rmoe_layer_forward(shared, x, y2)
  if (rc == 0) rc = rmoe_layer_backward(shared, dy, dx)
  if (rc == 0) rc = rmoe_layer_get_grad_shared_expert_gate(shared, sgate_back)
  call expect(rc == 0 .and. sum(abs(sgate_back)) > 0, 'gated shared expert forward, backward, gate gradient', rc)
  call expect(rmoe_layer_destroy(shared) == 0, 'rmoe_layer_destroy (gated shared)', 0)
  cfg%shared_gated = 0

  call expect_error(rmoe_ctx_destroy(ctx), RMOE_ESTATE, 'still alive', 'context destroyed before its layer')
  call expect(rmoe_layer_destroy(layer) == 0, 'rmoe_layer_destroy', 0)
  call expect_error(rmoe_layer_forward(layer, x, y), RMOE_ESTATE, &
                    'the layer is not created or was destroyed', 'a destroyed layer')
  call expect(rmoe_layer_destroy(layer) == 0, 'a second rmoe_layer_destroy does nothing', 0)
  call expect(rmoe_ctx_destroy(ctx) == 0, 'rmoe_ctx_destroy', 0)
  call expect(rmoe_ctx_destroy(ctx) == 0, 'a second rmoe_ctx_destroy does nothing', 0)
  call expect_error(rmoe_layer_create(layer, ctx, cfg), RMOE_ESTATE, &
                    'the context is not created or was destroyed', 'a layer on a destroyed context')

  call MPI_Allreduce(failures, all_failures, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) write(*, '(a, i0, a, i0, a)') 'test_api: ', nranks, ' ranks, ', all_failures, &
                                               ' failed check(s)'
  call MPI_Finalize(ierr)
  if (all_failures /= 0) error stop 1

contains

  subroutine expect(ok, what, code)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    integer(c_int), intent(in) :: code
    if (ok) return
    failures = failures + 1
    if (code /= 0) then
      write(*, '(a, i0, 4a)') 'test_api: rank ', rank, ': FAILED ', what, ': ', rmoe_strerror(code)
    else
      write(*, '(a, i0, 2a)') 'test_api: rank ', rank, ': FAILED ', what
    end if
  end subroutine

  ! code is want and rmoe_strerror(code) contains words.
  subroutine expect_error(code, want, words, what)
    integer(c_int), intent(in) :: code, want
    character(len=*), intent(in) :: words, what
    if (code == want .and. index(rmoe_strerror(code), words) > 0) return
    failures = failures + 1
    write(*, '(a, i0, 3a, i0, 5a)') 'test_api: rank ', rank, ': FAILED ', what, ': code ', code, &
      ', message "', rmoe_strerror(code), '", expected "', words, '"'
  end subroutine

  ! Seeded values, never zeros: scale * sin(phase + i j).
  subroutine fill(a, phase, scale)
    real(c_float), intent(out) :: a(:, :)
    real, intent(in) :: phase, scale
    integer :: i, j
    do j = 1, size(a, 2)
      do i = 1, size(a, 1)
        a(i, j) = scale * sin(phase + real(i) * 0.37 + real(j) * 1.13 + real(i * j) * 0.01)
      end do
    end do
  end subroutine

  function itoa(i) result(s)
    integer, intent(in) :: i
    character(len=:), allocatable :: s
    character(len=12) :: buf
    write(buf, '(i0)') i
    s = trim(buf)
  end function

  ! The shared expert's weights, the same in the ungated and the gated layer.
  subroutine fill_shared(gate, up, down)
    real(c_float), intent(out) :: gate(:, :), up(:, :), down(:, :)
    call fill(gate, 7.1, 0.125)
    call fill(up, 8.3, 0.125)
    call fill(down, 9.7, 0.25)
  end subroutine

end program test_api
