! relaymoe from Fortran 2008: the C API of include/relaymoe/relaymoe.h through
! iso_c_binding. Module relaymoe_mpi (relaymoe_mpi.f90) adds the context over
! a type(MPI_Comm) of mpi_f08, as relaymoe_mpi.h does for C.
!
! Array layout. The library's arrays are row-major (C order). Every array
! argument here is the library's memory as it is, so its Fortran shape is the
! C shape reversed:
!   x, y, dy, dx          C [T, H]      Fortran (hidden, tokens): token t is x(:, t)
!   w_router, dw_router   C [H, E]      Fortran (experts, hidden)
!   w_gate, w_up (e)      C [H, F]      Fortran (ffn, hidden)
!   w_down (e)            C [F, H]      Fortran (hidden, ffn)
!   shared gate, up       C [H, FS]     Fortran (shared_ffn, hidden); down (hidden, shared_ffn)
!   dprobs, probs         C [T, E]      Fortran (experts, tokens)
!   topk_idx, topk_w      C [T, K]      Fortran (topk, tokens)
! Nothing is transposed or copied. In this layout the weights act on a token
! column by matmul: logits = matmul(w_router, x(:, t)),
! a = matmul(w_gate, x(:, t)), y(:, t) = matmul(w_down, act).
! Every shape is checked against the layer's configuration: a mismatch
! returns RMOE_EINVAL naming the argument, its shape and the one expected,
! so an array in the C-shaped orientation is refused (unless it is square).
! tokens is this rank's count: any number from 0, which may differ between
! the ranks and change from call to call. cfg%tokens is the capacity, and
! the count until rmoe_layer_set_tokens sets another; x and y have the count
! set (layer%tokens), dy, dx, dprobs and the routing the last forward's
! (layer%forward_tokens).
! Array dummies are contiguous: the compiler copies a non-contiguous section
! in (and out) around the call.
!
! Numbers stay the library's: experts are 0 .. E-1 (rmoe_layer_owned_experts
! gives the first one this rank owns), and routing indices are 0-based.
!
! Errors: every function returns 0 or a negative RMOE_E* code, and
! rmoe_strerror(code) gives the sentence naming the bad value: the library's,
! or the one written here for a check made here (shapes, a destroyed layer).
! Like the library's, that message belongs to the last failed call; unlike
! it, it is not per thread: call the layer from one thread.
!
! The structs are mirrored field for field (bind(c)); C enums are c_int.
! tests/fortran compiles a program from the installed header and fails on
! any difference (tests/fortran/layout.f90).
module relaymoe
  use, intrinsic :: iso_c_binding
  implicit none
  private

  ! ---- enums of relaymoe.h ----------------------------------------------------
  integer(c_int), parameter, public :: RMOE_OK = 0, RMOE_EINVAL = -1, RMOE_ENOMEM = -2, &
    RMOE_EMPI = -3, RMOE_ESTARPU = -4, RMOE_EMISMATCH = -5, RMOE_ESTATE = -6, RMOE_ENOTSUP = -7, &
    RMOE_EIO = -8, RMOE_ENONFINITE = -9, RMOE_EFORMAT = -10, RMOE_EPEER = -11
  integer(c_int), parameter, public :: RMOE_DISPATCH_ALLTOALL = 0, RMOE_DISPATCH_RING_EXPERT = 1, &
    RMOE_DISPATCH_RING_TOKEN = 2, RMOE_DISPATCH_AUTO = 3, RMOE_DISPATCH_ALLTOALL_MEGATRON = 4, &
    RMOE_DISPATCH_ALLTOALL_DEEPEP = 5
  integer(c_int), parameter, public :: RMOE_DTYPE_F32 = 0, RMOE_DTYPE_BF16 = 1
  integer(c_int), parameter, public :: RMOE_MEMORY_HOST = 0, RMOE_MEMORY_DEVICE = 1
  integer(c_int), parameter, public :: RMOE_RING_PLANNED = 0, RMOE_RING_RANK = 1

  ! ---- struct mirrors -----------------------------------------------------------
  ! Strings (sched, cluster_file, trace) are set through the optional
  ! arguments of rmoe_ctx_create*, which keep a C copy for the context.
  type, bind(c), public :: rmoe_ctx_config
    integer(c_int) :: ncpus
    integer(c_int) :: ncuda
    type(c_ptr) :: sched
    integer(c_int) :: verbose
    type(c_ptr) :: cluster_file
    type(c_ptr) :: trace
    integer(c_int) :: ring_order
    integer(c_int) :: blas_threads
    integer(c_int) :: ranks_per_node
  end type

  type, bind(c), public :: rmoe_layer_config
    integer(c_int64_t) :: hidden
    integer(c_int64_t) :: ffn
    integer(c_int64_t) :: experts
    integer(c_int64_t) :: topk
    integer(c_int64_t) :: tokens
    integer(c_int) :: norm_topk
    integer(c_int64_t) :: shared_ffn
    integer(c_int) :: shared_gated
    integer(c_int) :: dispatch
    integer(c_int) :: dtype
    integer(c_int64_t) :: chunk_rows
    integer(c_int) :: overlap
    integer(c_int) :: deterministic
    integer(c_int64_t) :: mem_cap
    integer(c_int) :: check_finite
    real(c_double) :: wait_timeout
    integer(c_int64_t) :: partitions
    integer(c_int) :: window
    integer(c_int) :: stripes
  end type

  type, bind(c), public :: rmoe_layer_stats
    real(c_double) :: forward_seconds
    real(c_double) :: backward_seconds
    integer(c_int64_t) :: peak_forward_bytes
    integer(c_int64_t) :: peak_backward_bytes
    integer(c_int64_t) :: resident_bytes
    integer(c_int64_t) :: largest_temporary_bytes
    integer(c_int64_t) :: bytes_sent_forward
    integer(c_int64_t) :: bytes_sent_backward
    integer(c_int64_t) :: peak_rss_bytes
    integer(c_int) :: hops
    integer(c_int64_t) :: chunk_rows
    integer(c_int64_t) :: peak_device_forward_bytes
    integer(c_int64_t) :: peak_device_backward_bytes
    integer(c_int) :: host_waits_forward
    integer(c_int) :: host_waits_backward
    integer(c_int64_t) :: peak_heap_forward_bytes
    integer(c_int64_t) :: peak_heap_backward_bytes
    integer(c_int64_t) :: runtime_forward_bytes
    integer(c_int64_t) :: runtime_backward_bytes
  end type

  ! The C side writes whole structs (the *_init functions, get_stats) into
  ! these, 1 KiB larger than the mirrors: a library newer than the module,
  ! whose structs gained fields, writes into the slack instead of past the
  ! end, and its new fields keep the values its *_init gave them.
  type, bind(c) :: padded_ctx_config
    type(rmoe_ctx_config) :: cfg
    integer(c_int8_t) :: slack(1024)
  end type
  type, bind(c) :: padded_layer_config
    type(rmoe_layer_config) :: cfg
    integer(c_int8_t) :: slack(1024)
  end type
  type, bind(c) :: padded_layer_stats
    type(rmoe_layer_stats) :: stats
    integer(c_int8_t) :: slack(1024)
  end type

  ! ---- handles ------------------------------------------------------------------
  type, public :: rmoe_ctx
    type(c_ptr) :: ptr = c_null_ptr
    ! NUL-terminated copies of the configuration's strings, alive as long as
    ! the context (StarPU may read the policy name after starting).
    character(kind=c_char), pointer, private :: sched(:) => null(), cluster_file(:) => null(), &
      trace(:) => null()
  end type

  ! tokens: this rank's count for the next forward (rmoe_layer_set_tokens;
  ! cfg%tokens until set); forward_tokens: its count in the last forward;
  ! capacity: cfg%tokens, which the library grows when a forward brings
  ! more on some rank. Read them; the functions below set them.
  type, public :: rmoe_layer
    type(c_ptr) :: ptr = c_null_ptr
    integer(c_int64_t) :: hidden = 0, ffn = 0, experts = 0, topk = 0, tokens = 0, shared_ffn = 0
    integer(c_int64_t) :: forward_tokens = 0, capacity = 0
  end type

  public :: rmoe_strerror, rmoe_ctx_config_init, rmoe_ctx_create, rmoe_ctx_create_fcomm, rmoe_ctx_destroy, &
    rmoe_ctx_rank, rmoe_ctx_size, rmoe_ctx_ring_order, rmoe_layer_config_init, rmoe_layer_create, &
    rmoe_layer_destroy, rmoe_layer_owned_experts, rmoe_layer_dispatch, rmoe_layer_dispatch_reason, &
    rmoe_layer_set_router, rmoe_layer_get_router, rmoe_layer_set_expert, rmoe_layer_get_expert, &
    rmoe_layer_set_shared, rmoe_layer_forward, rmoe_layer_backward, rmoe_layer_get_grad_router, &
    rmoe_layer_get_grad_expert, rmoe_layer_get_grad_shared, rmoe_layer_check_finite, rmoe_layer_get_routing, &
    rmoe_layer_get_stats, rmoe_dispatch_name, rmoe_dispatch_parse, rmoe_layer_forward_raw, &
    rmoe_layer_backward_raw, rmoe_layer_set_shared_expert_gate, rmoe_layer_get_shared_expert_gate, &
    rmoe_layer_get_grad_shared_expert_gate, rmoe_layer_set_tokens, rmoe_layer_tokens

  ! The last error raised by a check of this module (0: none, defer to C).
  integer(c_int) :: f_code = 0
  character(len=:), allocatable :: f_message

  ! One interface body per C function, not procedure(iface), bind(c, name=...)
  ! declarations sharing one: through those, gfortran 12 passes every VALUE
  ! argument by reference once one of them is an expression such as c_loc(x).
  interface
    function c_strlen(s) bind(c, name='strlen') result(n)
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: n
    end function
    function c_strerror(code) bind(c, name='rmoe_strerror') result(s)
      import :: c_int, c_ptr
      integer(c_int), value :: code
      type(c_ptr) :: s
    end function
    subroutine c_ctx_config_init(cfg) bind(c, name='rmoe_ctx_config_init')
      import :: c_ptr
      type(c_ptr), value :: cfg
    end subroutine
    function c_ctx_create(ctx, cfg) bind(c, name='rmoe_ctx_create') result(rc)
      import :: c_ptr, c_int
      type(c_ptr) :: ctx
      type(c_ptr), value :: cfg
      integer(c_int) :: rc
    end function
    function c_ctx_create_fcomm(ctx, cfg, fcomm) bind(c, name='rmoe_ctx_create_fcomm') result(rc)
      import :: c_ptr, c_int
      type(c_ptr) :: ctx
      type(c_ptr), value :: cfg
      integer(c_int), value :: fcomm
      integer(c_int) :: rc
    end function
    function c_ctx_destroy(ctx) bind(c, name='rmoe_ctx_destroy') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: ctx
      integer(c_int) :: rc
    end function
    function c_ctx_rank(ctx) bind(c, name='rmoe_ctx_rank') result(r)
      import :: c_ptr, c_int
      type(c_ptr), value :: ctx
      integer(c_int) :: r
    end function
    function c_ctx_size(ctx) bind(c, name='rmoe_ctx_size') result(r)
      import :: c_ptr, c_int
      type(c_ptr), value :: ctx
      integer(c_int) :: r
    end function
    function c_ctx_ring_order(ctx, order) bind(c, name='rmoe_ctx_ring_order') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: ctx, order
      integer(c_int) :: rc
    end function
    subroutine c_layer_config_init(cfg) bind(c, name='rmoe_layer_config_init')
      import :: c_ptr
      type(c_ptr), value :: cfg
    end subroutine
    function c_layer_create(layer, ctx, cfg) bind(c, name='rmoe_layer_create') result(rc)
      import :: c_ptr, c_int
      type(c_ptr) :: layer
      type(c_ptr), value :: ctx, cfg
      integer(c_int) :: rc
    end function
    function c_layer_destroy(layer) bind(c, name='rmoe_layer_destroy') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer
      integer(c_int) :: rc
    end function
    function c_layer_set_tokens(layer, tokens) bind(c, name='rmoe_layer_set_tokens') result(rc)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: layer
      integer(c_int64_t), value :: tokens
      integer(c_int) :: rc
    end function
    function c_layer_tokens(layer) bind(c, name='rmoe_layer_tokens') result(n)
      import :: c_ptr, c_int64_t
      type(c_ptr), value :: layer
      integer(c_int64_t) :: n
    end function
    function c_layer_owned_experts(layer, first, count) bind(c, name='rmoe_layer_owned_experts') result(rc)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: layer
      integer(c_int64_t) :: first, count
      integer(c_int) :: rc
    end function
    function c_layer_dispatch(layer) bind(c, name='rmoe_layer_dispatch') result(d)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer
      integer(c_int) :: d
    end function
    function c_layer_dispatch_reason(layer) bind(c, name='rmoe_layer_dispatch_reason') result(s)
      import :: c_ptr
      type(c_ptr), value :: layer
      type(c_ptr) :: s
    end function
    ! set/get router, get grad router: (layer, w)
    function c_layer_set_router(layer, w) bind(c, name='rmoe_layer_set_router') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, w
      integer(c_int) :: rc
    end function
    function c_layer_get_router(layer, w) bind(c, name='rmoe_layer_get_router') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, w
      integer(c_int) :: rc
    end function
    function c_layer_get_grad_router(layer, w) bind(c, name='rmoe_layer_get_grad_router') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, w
      integer(c_int) :: rc
    end function
    ! the gated shared expert's gate, set/get and gradient: (layer, w)
    function c_layer_set_shared_expert_gate(layer, w) bind(c, name='rmoe_layer_set_shared_expert_gate') &
        result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, w
      integer(c_int) :: rc
    end function
    function c_layer_get_shared_expert_gate(layer, w) bind(c, name='rmoe_layer_get_shared_expert_gate') &
        result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, w
      integer(c_int) :: rc
    end function
    function c_layer_get_grad_shared_expert_gate(layer, w) &
        bind(c, name='rmoe_layer_get_grad_shared_expert_gate') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, w
      integer(c_int) :: rc
    end function
    ! experts: (layer, e, gate, up, down)
    function c_layer_set_expert(layer, e, g, u, d) bind(c, name='rmoe_layer_set_expert') result(rc)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: layer
      integer(c_int64_t), value :: e
      type(c_ptr), value :: g, u, d
      integer(c_int) :: rc
    end function
    function c_layer_get_expert(layer, e, g, u, d) bind(c, name='rmoe_layer_get_expert') result(rc)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: layer
      integer(c_int64_t), value :: e
      type(c_ptr), value :: g, u, d
      integer(c_int) :: rc
    end function
    function c_layer_get_grad_expert(layer, e, g, u, d) bind(c, name='rmoe_layer_get_grad_expert') result(rc)
      import :: c_ptr, c_int, c_int64_t
      type(c_ptr), value :: layer
      integer(c_int64_t), value :: e
      type(c_ptr), value :: g, u, d
      integer(c_int) :: rc
    end function
    ! shared expert: (layer, gate, up, down)
    function c_layer_set_shared(layer, g, u, d) bind(c, name='rmoe_layer_set_shared') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, g, u, d
      integer(c_int) :: rc
    end function
    function c_layer_get_grad_shared(layer, g, u, d) bind(c, name='rmoe_layer_get_grad_shared') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, g, u, d
      integer(c_int) :: rc
    end function
    function c_layer_forward(layer, x, y) bind(c, name='rmoe_layer_forward') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, x, y
      integer(c_int) :: rc
    end function
    function c_layer_forward_raw(layer, where, x, y) bind(c, name='rmoe_layer_forward_raw') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, x, y
      integer(c_int), value :: where
      integer(c_int) :: rc
    end function
    function c_layer_backward_raw(layer, where, dy, dprobs, dx) bind(c, name='rmoe_layer_backward_raw') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, dy, dprobs, dx
      integer(c_int), value :: where
      integer(c_int) :: rc
    end function
    function c_layer_backward_ex(layer, dy, dprobs, dx) bind(c, name='rmoe_layer_backward_ex') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, dy, dprobs, dx
      integer(c_int) :: rc
    end function
    function c_layer_check_finite(layer, x, dy) bind(c, name='rmoe_layer_check_finite') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, x, dy
      integer(c_int) :: rc
    end function
    function c_layer_get_routing(layer, idx, w, probs) bind(c, name='rmoe_layer_get_routing') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, idx, w, probs
      integer(c_int) :: rc
    end function
    function c_layer_get_stats(layer, stats) bind(c, name='rmoe_layer_get_stats') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: layer, stats
      integer(c_int) :: rc
    end function
    function c_dispatch_name(d) bind(c, name='rmoe_dispatch_name') result(s)
      import :: c_ptr, c_int
      integer(c_int), value :: d
      type(c_ptr) :: s
    end function
    function c_dispatch_parse(name, d) bind(c, name='rmoe_dispatch_parse') result(rc)
      import :: c_ptr, c_int
      type(c_ptr), value :: name
      integer(c_int) :: d
      integer(c_int) :: rc
    end function
  end interface

contains

  ! ---- helpers --------------------------------------------------------------------

  ! A C string as a Fortran string ('' for NULL).
  function from_c_string(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    if (.not. c_associated(p)) then
      s = ''
      return
    end if
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: s)
    do i = 1, n
      s(i:i) = chars(i)
    end do
  end function

  ! A NUL-terminated copy of s that lives until deallocated.
  function to_c_string(s) result(p)
    character(len=*), intent(in) :: s
    character(kind=c_char), pointer :: p(:)
    integer :: i
    allocate(p(len(s) + 1))
    do i = 1, len(s)
      p(i) = s(i:i)
    end do
    p(len(s) + 1) = c_null_char
  end function

  ! Records a failed check of this module and returns its code.
  function fail(code, message) result(rc)
    integer(c_int), intent(in) :: code
    character(len=*), intent(in) :: message
    integer(c_int) :: rc
    f_code = code
    f_message = message
    rc = code
  end function

  ! The code of a C call: a failure's message is then the library's.
  function from_c(code) result(rc)
    integer(c_int), intent(in) :: code
    integer(c_int) :: rc
    if (code /= 0) f_code = 0
    rc = code
  end function

  function itoa(i) result(s)
    integer(c_int64_t), intent(in) :: i
    character(len=:), allocatable :: s
    character(len=24) :: buf
    write(buf, '(i0)') i
    s = trim(buf)
  end function

  function shape_text(a, b) result(s)
    integer(c_int64_t), intent(in) :: a, b
    character(len=:), allocatable :: s
    s = '(' // itoa(a) // ', ' // itoa(b) // ')'
  end function

  ! 0 if the rank-2 array of shape got is (n1, n2); otherwise RMOE_EINVAL
  ! naming it, with the C shape it mirrors.
  function check_shape(name, got, n1, l1, n2, l2, cshape) result(rc)
    character(len=*), intent(in) :: name, l1, l2, cshape
    integer, intent(in) :: got(2)
    integer(c_int64_t), intent(in) :: n1, n2
    integer(c_int) :: rc
    rc = 0
    if (int(got(1), c_int64_t) /= n1 .or. int(got(2), c_int64_t) /= n2) &
      rc = fail(RMOE_EINVAL, name // ' is ' // shape_text(int(got(1), c_int64_t), int(got(2), c_int64_t)) // &
                ': expected (' // l1 // '=' // itoa(n1) // ', ' // l2 // '=' // itoa(n2) // &
                '), the library''s ' // cshape // ' in memory order (the C shape reversed)')
  end function

  ! RMOE_ESTATE naming what (the layer, the context) when its handle is NULL.
  function check_created(ptr, what) result(rc)
    type(c_ptr), intent(in) :: ptr
    character(len=*), intent(in) :: what
    integer(c_int) :: rc
    rc = 0
    if (.not. c_associated(ptr)) rc = fail(RMOE_ESTATE, 'the ' // what // ' is not created or was destroyed')
  end function

  function check_layer(layer) result(rc)
    type(rmoe_layer), intent(in) :: layer
    integer(c_int) :: rc
    rc = check_created(layer%ptr, 'layer')
  end function

  ! A present optional array argument: when rc is 0, rc becomes check_shape's
  ! verdict on it and p its address. Callers set p to NULL and call it only
  ! when the argument is present: gfortran 12 reads an absent contiguous
  ! array's descriptor when passing it on (UBSan: load of a null pointer).
  ! The C side may write through p (no intent).
  subroutine take_present(rc, p, name, a, n1, l1, n2, l2, cshape)
    integer(c_int), intent(inout) :: rc
    type(c_ptr), intent(inout) :: p
    character(len=*), intent(in) :: name, l1, l2, cshape
    real(c_float), target, contiguous :: a(:, :)
    integer(c_int64_t), intent(in) :: n1, n2
    if (rc /= 0) return
    rc = check_shape(name, shape(a), n1, l1, n2, l2, cshape)
    if (rc == 0) p = c_loc(a)
  end subroutine

  ! ---- errors -----------------------------------------------------------------------

  !> The sentence for code: this module's message when its last failed check
  !> gave code, otherwise the library's (rmoe_strerror).
  function rmoe_strerror(code) result(message)
    integer(c_int), intent(in) :: code
    character(len=:), allocatable :: message
    if (code /= 0 .and. code == f_code .and. allocated(f_message)) then
      message = f_message
    else
      message = from_c_string(c_strerror(code))
    end if
  end function

  ! ---- context ------------------------------------------------------------------------

  !> Defaults: automatic workers, no GPU preference, StarPU's policy, quiet, no trace.
  subroutine rmoe_ctx_config_init(cfg)
    type(rmoe_ctx_config), intent(out) :: cfg
    type(padded_ctx_config), target :: p
    call c_ctx_config_init(c_loc(p))
    cfg = p%cfg
  end subroutine

  ! s, when present, as a C string the context keeps (copy) and the
  ! configuration's field points to.
  subroutine keep_string(copy, field, s)
    character(kind=c_char), pointer, intent(inout) :: copy(:)
    type(c_ptr), intent(inout) :: field
    character(len=*), intent(in), optional :: s
    if (.not. present(s)) return
    copy => to_c_string(s)
    field = c_loc(copy)
  end subroutine

  subroutine release_strings(ctx)
    type(rmoe_ctx), intent(inout) :: ctx
    if (associated(ctx%sched)) deallocate(ctx%sched)
    if (associated(ctx%cluster_file)) deallocate(ctx%cluster_file)
    if (associated(ctx%trace)) deallocate(ctx%trace)
  end subroutine

  ! rmoe_ctx_create, or rmoe_ctx_create_fcomm over fcomm when it is present.
  function create_ctx(ctx, cfg, sched, cluster_file, trace, fcomm) result(rc)
    type(rmoe_ctx), intent(inout) :: ctx
    type(rmoe_ctx_config), intent(in), optional :: cfg
    character(len=*), intent(in), optional :: sched, cluster_file, trace
    integer, intent(in), optional :: fcomm
    integer(c_int) :: rc
    type(padded_ctx_config), target :: p
    call release_strings(ctx)
    call c_ctx_config_init(c_loc(p))
    if (present(cfg)) p%cfg = cfg
    call keep_string(ctx%sched, p%cfg%sched, sched)
    call keep_string(ctx%cluster_file, p%cfg%cluster_file, cluster_file)
    call keep_string(ctx%trace, p%cfg%trace, trace)
    if (present(fcomm)) then
      rc = from_c(c_ctx_create_fcomm(ctx%ptr, c_loc(p), int(fcomm, c_int)))
    else
      rc = from_c(c_ctx_create(ctx%ptr, c_loc(p)))
    end if
    if (rc /= 0) call release_strings(ctx)
  end function

  !> The context over MPI_COMM_WORLD (rmoe_ctx_create): MPI is initialised
  !> with MPI_THREAD_MULTIPLE when the program has not done it, and then
  !> finalised by rmoe_ctx_destroy. cfg: rmoe_ctx_config_init's defaults when
  !> absent; sched, cluster_file, trace set those fields. Collective.
  function rmoe_ctx_create(ctx, cfg, sched, cluster_file, trace) result(rc)
    type(rmoe_ctx), intent(inout) :: ctx
    type(rmoe_ctx_config), intent(in), optional :: cfg
    character(len=*), intent(in), optional :: sched, cluster_file, trace
    integer(c_int) :: rc
    rc = create_ctx(ctx, cfg, sched, cluster_file, trace)
  end function

  !> The same over a communicator given by its Fortran handle: an integer
  !> from `use mpi` / mpif.h, or comm%MPI_VAL of an mpi_f08 type(MPI_Comm)
  !> (relaymoe_mpi's rmoe_ctx_create_comm takes the type itself). MPI must be
  !> initialised with MPI_THREAD_MULTIPLE.
  function rmoe_ctx_create_fcomm(ctx, comm, cfg, sched, cluster_file, trace) result(rc)
    type(rmoe_ctx), intent(inout) :: ctx
    integer, intent(in) :: comm
    type(rmoe_ctx_config), intent(in), optional :: cfg
    character(len=*), intent(in), optional :: sched, cluster_file, trace
    integer(c_int) :: rc
    rc = create_ctx(ctx, cfg, sched, cluster_file, trace, comm)
  end function

  !> Shuts down what the context started. Collective. Destroy its layers
  !> first (RMOE_ESTATE otherwise, and the context stays usable).
  function rmoe_ctx_destroy(ctx) result(rc)
    type(rmoe_ctx), intent(inout) :: ctx
    integer(c_int) :: rc
    if (.not. c_associated(ctx%ptr)) then
      rc = 0
      return
    end if
    rc = from_c(c_ctx_destroy(ctx%ptr))
    ! RMOE_ESTATE (layers still alive) is the one failure that leaves the
    ! context in place; after any other the library has freed it.
    if (rc /= RMOE_ESTATE) then
      ctx%ptr = c_null_ptr
      call release_strings(ctx)
    end if
  end function

  function rmoe_ctx_rank(ctx) result(r)
    type(rmoe_ctx), intent(in) :: ctx
    integer(c_int) :: r
    r = c_ctx_rank(ctx%ptr)
  end function

  function rmoe_ctx_size(ctx) result(r)
    type(rmoe_ctx), intent(in) :: ctx
    integer(c_int) :: r
    r = c_ctx_size(ctx%ptr)
  end function

  !> order(i) is the rank at ring position i-1 (rmoe_ctx_size entries).
  function rmoe_ctx_ring_order(ctx, order) result(rc)
    type(rmoe_ctx), intent(in) :: ctx
    integer(c_int), intent(out), target, contiguous :: order(:)
    integer(c_int) :: rc
    rc = check_created(ctx%ptr, 'context')
    if (rc /= 0) return
    if (size(order) /= rmoe_ctx_size(ctx)) then
      rc = fail(RMOE_EINVAL, 'order has ' // itoa(int(size(order), c_int64_t)) // ' entries: expected ' // &
                itoa(int(rmoe_ctx_size(ctx), c_int64_t)) // ', the ranks of the context')
      return
    end if
    rc = from_c(c_ctx_ring_order(ctx%ptr, c_loc(order)))
  end function

  ! ---- layer --------------------------------------------------------------------------

  !> Defaults (rmoe_layer_config_init): H=128, F=48, E=128, K=8, T=3072,
  !> norm_topk on, ring expert routing, fp32, overlap on.
  subroutine rmoe_layer_config_init(cfg)
    type(rmoe_layer_config), intent(out) :: cfg
    type(padded_layer_config), target :: p
    call c_layer_config_init(c_loc(p))
    cfg = p%cfg
  end subroutine

  !> Collective over the context's ranks: every rank passes the same cfg.
  function rmoe_layer_create(layer, ctx, cfg) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    type(rmoe_ctx), intent(in) :: ctx
    type(rmoe_layer_config), intent(in) :: cfg
    integer(c_int) :: rc
    type(padded_layer_config), target :: p
    rc = check_created(ctx%ptr, 'context')
    if (rc /= 0) return
    call c_layer_config_init(c_loc(p))
    p%cfg = cfg
    rc = from_c(c_layer_create(layer%ptr, ctx%ptr, c_loc(p)))
    if (rc /= 0) return
    layer%hidden = cfg%hidden
    layer%ffn = cfg%ffn
    layer%experts = cfg%experts
    layer%topk = cfg%topk
    layer%tokens = cfg%tokens
    layer%forward_tokens = cfg%tokens
    layer%capacity = cfg%tokens
    layer%shared_ffn = cfg%shared_ffn
  end function

  !> Not collective. A destroyed (or never created) layer: 0.
  function rmoe_layer_destroy(layer) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    integer(c_int) :: rc
    rc = 0
    if (.not. c_associated(layer%ptr)) return
    rc = from_c(c_layer_destroy(layer%ptr))
    layer%ptr = c_null_ptr
  end function

  !> This rank's token count for the forwards that follow, 0 included: x and
  !> y of rmoe_layer_forward are then (hidden, tokens). Not collective: ranks
  !> may set different counts, and change them from call to call. A count
  !> above the capacity (cfg%tokens) grows it on every rank at that forward,
  !> except under mem_cap (that forward fails with RMOE_EINVAL on every
  !> rank). RMOE_EINVAL for a negative count.
  function rmoe_layer_set_tokens(layer, tokens) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    integer, intent(in) :: tokens
    integer(c_int) :: rc
    rc = check_layer(layer)
    if (rc /= 0) return
    rc = from_c(c_layer_set_tokens(layer%ptr, int(tokens, c_int64_t)))
    if (rc == 0) layer%tokens = tokens
  end function

  !> The count the next forward takes (as last set), or -1 for a layer not
  !> created or destroyed.
  function rmoe_layer_tokens(layer) result(n)
    type(rmoe_layer), intent(in) :: layer
    integer(c_int64_t) :: n
    n = c_layer_tokens(layer%ptr)
  end function

  !> The routed experts this rank owns: first .. first + count - 1 (0-based).
  function rmoe_layer_owned_experts(layer, first, count) result(rc)
    type(rmoe_layer), intent(in) :: layer
    integer, intent(out) :: first, count
    integer(c_int) :: rc
    integer(c_int64_t) :: f, n
    first = -1
    count = 0
    rc = check_layer(layer)
    if (rc /= 0) return
    rc = from_c(c_layer_owned_experts(layer%ptr, f, n))
    first = int(f)
    count = int(n)
  end function

  !> RMOE_DISPATCH_* that the layer runs (the choice made for auto).
  function rmoe_layer_dispatch(layer) result(d)
    type(rmoe_layer), intent(in) :: layer
    integer(c_int) :: d
    d = c_layer_dispatch(layer%ptr)
  end function

  function rmoe_layer_dispatch_reason(layer) result(reason)
    type(rmoe_layer), intent(in) :: layer
    character(len=:), allocatable :: reason
    reason = from_c_string(c_layer_dispatch_reason(layer%ptr))
  end function

  ! A router-shaped array, w(experts, hidden) for C [H, E], through fn(layer, w)
  ! (set, get or the gradient).
  function router_call(layer, name, w, fn) result(rc)
    type(rmoe_layer), intent(in) :: layer
    character(len=*), intent(in) :: name
    real(c_float), target, contiguous :: w(:, :)
    procedure(c_layer_set_router) :: fn
    integer(c_int) :: rc
    rc = check_layer(layer)
    if (rc == 0) rc = check_shape(name, shape(w), layer%experts, 'experts', layer%hidden, 'hidden', '[H, E]')
    if (rc == 0) rc = from_c(fn(layer%ptr, c_loc(w)))
  end function

  !> w_router(experts, hidden): C [H, E]. The same on every rank.
  function rmoe_layer_set_router(layer, w_router) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    real(c_float), intent(in), target, contiguous :: w_router(:, :)
    integer(c_int) :: rc
    rc = router_call(layer, 'w_router', w_router, c_layer_set_router)
  end function

  function rmoe_layer_get_router(layer, w_router) result(rc)
    type(rmoe_layer), intent(in) :: layer
    real(c_float), intent(out), target, contiguous :: w_router(:, :)
    integer(c_int) :: rc
    rc = router_call(layer, 'w_router', w_router, c_layer_get_router)
  end function

  ! Shapes of an expert's three matrices; width is F (label 'ffn', C letter
  ! 'F') or FS for the shared expert.
  function check_expert(layer, gate, up, down, width, label, letter) result(rc)
    type(rmoe_layer), intent(in) :: layer
    integer, intent(in) :: gate(2), up(2), down(2)
    integer(c_int64_t), intent(in) :: width
    character(len=*), intent(in) :: label, letter
    integer(c_int) :: rc
    rc = check_layer(layer)
    if (rc == 0) rc = check_shape('w_gate', gate, width, label, layer%hidden, 'hidden', &
                                  '[H, ' // letter // ']')
    if (rc == 0) rc = check_shape('w_up', up, width, label, layer%hidden, 'hidden', '[H, ' // letter // ']')
    if (rc == 0) rc = check_shape('w_down', down, layer%hidden, 'hidden', width, label, &
                                  '[' // letter // ', H]')
  end function

  ! Routed expert e's three matrices through fn(layer, e, gate, up, down) (set,
  ! get or the gradients).
  function expert_call(layer, e, gate, up, down, fn) result(rc)
    type(rmoe_layer), intent(in) :: layer
    integer, intent(in) :: e
    real(c_float), target, contiguous :: gate(:, :), up(:, :), down(:, :)
    procedure(c_layer_set_expert) :: fn
    integer(c_int) :: rc
    rc = check_expert(layer, shape(gate), shape(up), shape(down), layer%ffn, 'ffn', 'F')
    if (rc == 0) rc = from_c(fn(layer%ptr, int(e, c_int64_t), c_loc(gate), c_loc(up), c_loc(down)))
  end function

  ! The shared expert's three matrices through fn(layer, gate, up, down) (set
  ! or the gradients).
  function shared_call(layer, gate, up, down, fn) result(rc)
    type(rmoe_layer), intent(in) :: layer
    real(c_float), target, contiguous :: gate(:, :), up(:, :), down(:, :)
    procedure(c_layer_set_shared) :: fn
    integer(c_int) :: rc
    rc = check_expert(layer, shape(gate), shape(up), shape(down), layer%shared_ffn, 'shared_ffn', 'FS')
    if (rc == 0) rc = from_c(fn(layer%ptr, c_loc(gate), c_loc(up), c_loc(down)))
  end function

  !> Expert e (0-based, owned by this rank): w_gate, w_up(ffn, hidden),
  !> w_down(hidden, ffn).
  function rmoe_layer_set_expert(layer, e, w_gate, w_up, w_down) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    integer, intent(in) :: e
    real(c_float), intent(in), target, contiguous :: w_gate(:, :), w_up(:, :), w_down(:, :)
    integer(c_int) :: rc
    rc = expert_call(layer, e, w_gate, w_up, w_down, c_layer_set_expert)
  end function

  function rmoe_layer_get_expert(layer, e, w_gate, w_up, w_down) result(rc)
    type(rmoe_layer), intent(in) :: layer
    integer, intent(in) :: e
    real(c_float), intent(out), target, contiguous :: w_gate(:, :), w_up(:, :), w_down(:, :)
    integer(c_int) :: rc
    rc = expert_call(layer, e, w_gate, w_up, w_down, c_layer_get_expert)
  end function

  !> The shared expert: w_gate, w_up(shared_ffn, hidden), w_down(hidden, shared_ffn).
  function rmoe_layer_set_shared(layer, w_gate, w_up, w_down) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    real(c_float), intent(in), target, contiguous :: w_gate(:, :), w_up(:, :), w_down(:, :)
    integer(c_int) :: rc
    rc = shared_call(layer, w_gate, w_up, w_down, c_layer_set_shared)
  end function

  ! Enters the forward the other ranks are in with NULL arguments, which
  ! fails the library's collective argument check on every rank. A rank set
  ! to 0 tokens may pass NULL, so it refuses with a count of 1, then has
  ! its own back.
  subroutine refuse_forward(layer)
    type(rmoe_layer), intent(in) :: layer
    integer(c_int) :: ignored
    ignored = c_layer_set_tokens(layer%ptr, max(layer%tokens, 1_c_int64_t))
    ignored = c_layer_forward(layer%ptr, c_null_ptr, c_null_ptr)
    ignored = c_layer_set_tokens(layer%ptr, layer%tokens)
  end subroutine

  !> y(hidden, tokens) for x(hidden, tokens), tokens this rank's count
  !> (rmoe_layer_set_tokens). Collective; the ranks' counts may differ.
  !> When this rank's arguments are refused, it still enters the library's
  !> collective argument check (with NULL), so every rank fails alike and
  !> none waits.
  function rmoe_layer_forward(layer, x, y) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    real(c_float), intent(in), target, contiguous :: x(:, :)
    real(c_float), intent(out), target, contiguous :: y(:, :)
    integer(c_int) :: rc
    rc = check_layer(layer)
    if (rc /= 0) return
    rc = check_shape('x', shape(x), layer%hidden, 'hidden', layer%tokens, 'tokens', '[T, H]')
    if (rc == 0) rc = check_shape('y', shape(y), layer%hidden, 'hidden', layer%tokens, 'tokens', '[T, H]')
    if (rc /= 0) then
      call refuse_forward(layer)
      return
    end if
    rc = from_c(c_layer_forward(layer%ptr, c_loc(x), c_loc(y)))
    if (rc == 0) layer%forward_tokens = layer%tokens
  end function

  !> The forward on buffers in the layer's element type (c_float, or bf16
  !> bits as 2-byte integers) given as addresses, in main memory or on the
  !> rank's CUDA device (where: RMOE_MEMORY_HOST or RMOE_MEMORY_DEVICE; a
  !> device address from cudaMalloc, e.g. c_devloc in CUDA Fortran).
  !> Collective; the C library checks everything. The count is the one set
  !> (rmoe_layer_set_tokens).
  function rmoe_layer_forward_raw(layer, where, x, y) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    integer(c_int), intent(in) :: where
    type(c_ptr), intent(in) :: x, y
    integer(c_int) :: rc
    rc = check_layer(layer)
    if (rc == 0) rc = from_c(c_layer_forward_raw(layer%ptr, where, x, y))
    if (rc == 0) layer%forward_tokens = layer%tokens
  end function

  !> The backward likewise, on the last forward's count; dprobs (c_float,
  !> experts x tokens) may be c_null_ptr.
  function rmoe_layer_backward_raw(layer, where, dy, dx, dprobs) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    integer(c_int), intent(in) :: where
    type(c_ptr), intent(in) :: dy, dx, dprobs
    integer(c_int) :: rc
    rc = check_layer(layer)
    if (rc == 0) rc = from_c(c_layer_backward_raw(layer%ptr, where, dy, dprobs, dx))
  end function

  !> dx(hidden, tokens) for dy(hidden, tokens) of the last forward, and
  !> dprobs(experts, tokens), a gradient on the router probabilities, when
  !> present (rmoe_layer_backward_ex); tokens is that forward's count
  !> (layer%forward_tokens). Collective; refused arguments as in forward
  !> (but a rank that had no tokens in that forward passes the library's
  !> check: only the others' backward goes on).
  function rmoe_layer_backward(layer, dy, dx, dprobs) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    real(c_float), intent(in), target, contiguous :: dy(:, :)
    real(c_float), intent(out), target, contiguous :: dx(:, :)
    real(c_float), intent(in), target, contiguous, optional :: dprobs(:, :)
    integer(c_int) :: rc, ignored
    type(c_ptr) :: pprobs
    rc = check_layer(layer)
    if (rc /= 0) return
    rc = check_shape('dy', shape(dy), layer%hidden, 'hidden', layer%forward_tokens, 'tokens', '[T, H]')
    if (rc == 0) rc = check_shape('dx', shape(dx), layer%hidden, 'hidden', layer%forward_tokens, 'tokens', &
                                  '[T, H]')
    pprobs = c_null_ptr
    if (present(dprobs)) call take_present(rc, pprobs, 'dprobs', dprobs, &
                                    layer%experts, 'experts', layer%forward_tokens, 'tokens', '[T, E]')
    if (rc /= 0) then
      ignored = c_layer_backward_ex(layer%ptr, c_null_ptr, c_null_ptr, c_null_ptr)
      return
    end if
    rc = from_c(c_layer_backward_ex(layer%ptr, c_loc(dy), pprobs, c_loc(dx)))
  end function

  !> dw_router(experts, hidden) from this rank's tokens: sum it over ranks.
  function rmoe_layer_get_grad_router(layer, dw_router) result(rc)
    type(rmoe_layer), intent(in) :: layer
    real(c_float), intent(out), target, contiguous :: dw_router(:, :)
    integer(c_int) :: rc
    rc = router_call(layer, 'dw_router', dw_router, c_layer_get_grad_router)
  end function

  !> Gradients of owned expert e, complete over all ranks' tokens.
  function rmoe_layer_get_grad_expert(layer, e, dw_gate, dw_up, dw_down) result(rc)
    type(rmoe_layer), intent(in) :: layer
    integer, intent(in) :: e
    real(c_float), intent(out), target, contiguous :: dw_gate(:, :), dw_up(:, :), dw_down(:, :)
    integer(c_int) :: rc
    rc = expert_call(layer, e, dw_gate, dw_up, dw_down, c_layer_get_grad_expert)
  end function

  ! The gated shared expert's gate, w(hidden), through fn(layer, w).
  function shared_gate_call(layer, name, w, fn) result(rc)
    type(rmoe_layer), intent(in) :: layer
    character(len=*), intent(in) :: name
    real(c_float), target, contiguous :: w(:)
    procedure(c_layer_set_router) :: fn
    integer(c_int) :: rc
    rc = check_layer(layer)
    if (rc == 0 .and. int(size(w), c_int64_t) /= layer%hidden) &
      rc = fail(RMOE_EINVAL, name // ' has ' // itoa(int(size(w), c_int64_t)) // ' elements: expected hidden=' // &
                itoa(layer%hidden) // ', the library''s [H]')
    if (rc == 0) rc = from_c(fn(layer%ptr, c_loc(w)))
  end function

  !> w(hidden): the gate of a gated shared expert (shared_gated = 1, Qwen2-MoE's
  !> shared_expert_gate). The same on every rank.
  function rmoe_layer_set_shared_expert_gate(layer, w) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    real(c_float), intent(in), target, contiguous :: w(:)
    integer(c_int) :: rc
    rc = shared_gate_call(layer, 'w_shared_expert_gate', w, c_layer_set_shared_expert_gate)
  end function

  function rmoe_layer_get_shared_expert_gate(layer, w) result(rc)
    type(rmoe_layer), intent(in) :: layer
    real(c_float), intent(out), target, contiguous :: w(:)
    integer(c_int) :: rc
    rc = shared_gate_call(layer, 'w_shared_expert_gate', w, c_layer_get_shared_expert_gate)
  end function

  !> dw(hidden) of the shared expert's gate from this rank's tokens: sum it over ranks.
  function rmoe_layer_get_grad_shared_expert_gate(layer, dw) result(rc)
    type(rmoe_layer), intent(in) :: layer
    real(c_float), intent(out), target, contiguous :: dw(:)
    integer(c_int) :: rc
    rc = shared_gate_call(layer, 'dw_shared_expert_gate', dw, c_layer_get_grad_shared_expert_gate)
  end function

  function rmoe_layer_get_grad_shared(layer, dw_gate, dw_up, dw_down) result(rc)
    type(rmoe_layer), intent(in) :: layer
    real(c_float), intent(out), target, contiguous :: dw_gate(:, :), dw_up(:, :), dw_down(:, :)
    integer(c_int) :: rc
    rc = shared_call(layer, dw_gate, dw_up, dw_down, c_layer_get_grad_shared)
  end function

  !> Collective: RMOE_ENONFINITE on every rank when a weight, or x or dy
  !> (hidden, tokens) when present, holds NaN or infinity. x is the next
  !> forward's input (the count set), dy the last forward's gradient.
  function rmoe_layer_check_finite(layer, x, dy) result(rc)
    type(rmoe_layer), intent(inout) :: layer
    real(c_float), intent(in), target, contiguous, optional :: x(:, :), dy(:, :)
    integer(c_int) :: rc
    type(c_ptr) :: px, pdy
    rc = check_layer(layer)
    px = c_null_ptr
    if (present(x)) call take_present(rc, px, 'x', x, &
                                    layer%hidden, 'hidden', layer%tokens, 'tokens', '[T, H]')
    pdy = c_null_ptr
    if (present(dy)) call take_present(rc, pdy, 'dy', dy, &
                                    layer%hidden, 'hidden', layer%forward_tokens, 'tokens', '[T, H]')
    if (rc == 0) rc = from_c(c_layer_check_finite(layer%ptr, px, pdy))
  end function

  !> Routing of the last forward, each optional: topk_idx(topk, tokens)
  !> (0-based experts), topk_w(topk, tokens), probs(experts, tokens), tokens
  !> that forward's count (layer%forward_tokens).
  function rmoe_layer_get_routing(layer, topk_idx, topk_w, probs) result(rc)
    type(rmoe_layer), intent(in) :: layer
    integer(c_int32_t), intent(out), target, contiguous, optional :: topk_idx(:, :)
    real(c_float), intent(out), target, contiguous, optional :: topk_w(:, :), probs(:, :)
    integer(c_int) :: rc
    type(c_ptr) :: pi, pw, pp
    pi = c_null_ptr
    rc = check_layer(layer)
    if (rc == 0 .and. present(topk_idx)) then
      rc = check_shape('topk_idx', shape(topk_idx), layer%topk, 'topk', layer%forward_tokens, 'tokens', &
                       '[T, K]')
      if (rc == 0) pi = c_loc(topk_idx)
    end if
    pw = c_null_ptr
    if (present(topk_w)) call take_present(rc, pw, 'topk_w', topk_w, &
                                    layer%topk, 'topk', layer%forward_tokens, 'tokens', '[T, K]')
    pp = c_null_ptr
    if (present(probs)) call take_present(rc, pp, 'probs', probs, &
                                    layer%experts, 'experts', layer%forward_tokens, 'tokens', '[T, E]')
    if (rc == 0) rc = from_c(c_layer_get_routing(layer%ptr, pi, pw, pp))
  end function

  function rmoe_layer_get_stats(layer, stats) result(rc)
    type(rmoe_layer), intent(in) :: layer
    type(rmoe_layer_stats), intent(out) :: stats
    integer(c_int) :: rc
    type(padded_layer_stats), target :: p
    rc = check_layer(layer)
    if (rc /= 0) return
    rc = from_c(c_layer_get_stats(layer%ptr, c_loc(p)))
    stats = p%stats
  end function

  !> 'a2a', 'ring', 'token', 'auto', 'a2a-megatron' or 'a2a-deepep'.
  function rmoe_dispatch_name(d) result(name)
    integer(c_int), intent(in) :: d
    character(len=:), allocatable :: name
    name = from_c_string(c_dispatch_name(d))
  end function

  function rmoe_dispatch_parse(name, d) result(rc)
    character(len=*), intent(in) :: name
    integer(c_int), intent(out) :: d
    integer(c_int) :: rc
    character(kind=c_char), pointer :: s(:)
    s => to_c_string(name)
    d = 0
    rc = from_c(c_dispatch_parse(c_loc(s), d))
    deallocate(s)
  end function

end module relaymoe
