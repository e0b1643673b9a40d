! The example's own implementation of the relaymoe layer, in double precision,
! from its definition (docs/running.md, "The layer"), in the Fortran layout of the
! relaymoe module: tokens are columns x(:, t); w_router(E, H); expert e's
! w_gate(:, :, e), w_up(:, :, e) are (F, H) and w_down(:, :, e) is (H, F),
! e = 1 .. E here for expert e-1 of the library.
module embed_reference
  use, intrinsic :: iso_fortran_env, only: real64
  implicit none
  private
  public :: moe_reference

  integer, parameter :: dp = real64

contains

  !> y and dx for the tokens x with output gradient dy, and the weight
  !> gradients summed over these tokens. K largest probabilities (ties: the
  !> lower expert), divided by their sum (norm_topk); gradients flow through
  !> the routing weights into the softmax, not through the choice.
  subroutine moe_reference(x, dy, w_router, w_gate, w_up, w_down, k, y, dx, dw_router, dw_gate, dw_up, &
                           dw_down)
    real(dp), intent(in) :: x(:, :), dy(:, :), w_router(:, :), w_gate(:, :, :), w_up(:, :, :), w_down(:, :, :)
    integer, intent(in) :: k
    real(dp), intent(out) :: y(:, :), dx(:, :), dw_router(:, :), dw_gate(:, :, :), dw_up(:, :, :), &
      dw_down(:, :, :)
    integer :: t, j, e, n_experts, idx(k)
    real(dp), allocatable :: p(:), dp_(:), dlogits(:), a(:), b(:), s(:), act(:), out(:), dact(:), da(:), db(:)
    real(dp) :: g(k), dg(k), total, dot_g
    logical, allocatable :: taken(:)

    n_experts = size(w_router, 1)
    allocate(p(n_experts), dp_(n_experts), dlogits(n_experts), taken(n_experts))
    y = 0
    dx = 0
    dw_router = 0
    dw_gate = 0
    dw_up = 0
    dw_down = 0
    do t = 1, size(x, 2)
      p = matmul(w_router, x(:, t))
      p = exp(p - maxval(p))
      p = p / sum(p)
      ! The K largest: strictly larger wins, so a tie keeps the lower expert.
      taken = .false.
      do j = 1, k
        idx(j) = 0
        do e = 1, n_experts
          if (taken(e)) cycle
          if (idx(j) == 0) then
            idx(j) = e
          else if (p(e) > p(idx(j))) then
            idx(j) = e
          end if
        end do
        taken(idx(j)) = .true.
      end do
      total = sum(p(idx))
      g = p(idx) / total
      do j = 1, k
        e = idx(j)
        a = matmul(w_gate(:, :, e), x(:, t))
        b = matmul(w_up(:, :, e), x(:, t))
        s = 1 / (1 + exp(-a))
        act = a * s * b
        out = matmul(w_down(:, :, e), act)
        y(:, t) = y(:, t) + g(j) * out
        dg(j) = dot_product(dy(:, t), out)
        ! The expert's backward with dout = g dy.
        dw_down(:, :, e) = dw_down(:, :, e) + &
                           g(j) * spread(dy(:, t), 2, size(act)) * spread(act, 1, size(dy, 1))
        dact = g(j) * matmul(dy(:, t), w_down(:, :, e))
        da = dact * b * (s + a * s * (1 - s))
        db = dact * a * s
        dw_gate(:, :, e) = dw_gate(:, :, e) + spread(da, 2, size(x, 1)) * spread(x(:, t), 1, size(da))
        dw_up(:, :, e) = dw_up(:, :, e) + spread(db, 2, size(x, 1)) * spread(x(:, t), 1, size(db))
        dx(:, t) = dx(:, t) + matmul(da, w_gate(:, :, e)) + matmul(db, w_up(:, :, e))
      end do
      ! Through g = p(idx) / sum(p(idx)), then the softmax.
      dot_g = dot_product(dg, g)
      dp_ = 0
      dp_(idx) = (dg - dot_g) / total
      dlogits = p * (dp_ - dot_product(p, dp_))
      dx(:, t) = dx(:, t) + matmul(dlogits, w_router)
      dw_router = dw_router + spread(dlogits, 2, size(x, 1)) * spread(x(:, t), 1, n_experts)
    end do
  end subroutine

end module embed_reference
