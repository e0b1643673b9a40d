! Prints the layout of the relaymoe module's bind(c) mirrors and the values of
! its enum constants in the lines of tests/python/struct_layout.py, which
! compares them with the installed relaymoe.h as the C compiler lays it out.
! A field is listed here by hand: one the header gains and the mirror lacks
! shows up as missing.
program layout
  use, intrinsic :: iso_c_binding
  use relaymoe
  implicit none
  type(rmoe_ctx_config), target :: c
  type(rmoe_layer_config), target :: l
  type(rmoe_layer_stats), target :: s

  call struct('rmoe_ctx_config', c_sizeof(c))
  call field('rmoe_ctx_config', 'ncpus', c_loc(c), c_loc(c%ncpus), c_sizeof(c%ncpus), 'int')
  call field('rmoe_ctx_config', 'ncuda', c_loc(c), c_loc(c%ncuda), c_sizeof(c%ncuda), 'int')
  call field('rmoe_ctx_config', 'sched', c_loc(c), c_loc(c%sched), c_sizeof(c%sched), 'ptr')
  call field('rmoe_ctx_config', 'verbose', c_loc(c), c_loc(c%verbose), c_sizeof(c%verbose), 'int')
  call field('rmoe_ctx_config', 'cluster_file', c_loc(c), c_loc(c%cluster_file), c_sizeof(c%cluster_file), &
             'ptr')
  call field('rmoe_ctx_config', 'trace', c_loc(c), c_loc(c%trace), c_sizeof(c%trace), 'ptr')
  call field('rmoe_ctx_config', 'ring_order', c_loc(c), c_loc(c%ring_order), c_sizeof(c%ring_order), 'int')
  call field('rmoe_ctx_config', 'blas_threads', c_loc(c), c_loc(c%blas_threads), c_sizeof(c%blas_threads), &
             'int')
  call field('rmoe_ctx_config', 'ranks_per_node', c_loc(c), c_loc(c%ranks_per_node), &
             c_sizeof(c%ranks_per_node), 'int')

  call struct('rmoe_layer_config', c_sizeof(l))
  call field('rmoe_layer_config', 'hidden', c_loc(l), c_loc(l%hidden), c_sizeof(l%hidden), 'int')
  call field('rmoe_layer_config', 'ffn', c_loc(l), c_loc(l%ffn), c_sizeof(l%ffn), 'int')
  call field('rmoe_layer_config', 'experts', c_loc(l), c_loc(l%experts), c_sizeof(l%experts), 'int')
  call field('rmoe_layer_config', 'topk', c_loc(l), c_loc(l%topk), c_sizeof(l%topk), 'int')
  call field('rmoe_layer_config', 'tokens', c_loc(l), c_loc(l%tokens), c_sizeof(l%tokens), 'int')
  call field('rmoe_layer_config', 'norm_topk', c_loc(l), c_loc(l%norm_topk), c_sizeof(l%norm_topk), 'int')
  call field('rmoe_layer_config', 'shared_ffn', c_loc(l), c_loc(l%shared_ffn), c_sizeof(l%shared_ffn), &
             'int')
  call field('rmoe_layer_config', 'shared_gated', c_loc(l), c_loc(l%shared_gated), c_sizeof(l%shared_gated), &
             'int')
  call field('rmoe_layer_config', 'dispatch', c_loc(l), c_loc(l%dispatch), c_sizeof(l%dispatch), 'int')
  call field('rmoe_layer_config', 'dtype', c_loc(l), c_loc(l%dtype), c_sizeof(l%dtype), 'int')
  call field('rmoe_layer_config', 'chunk_rows', c_loc(l), c_loc(l%chunk_rows), c_sizeof(l%chunk_rows), &
             'int')
  call field('rmoe_layer_config', 'overlap', c_loc(l), c_loc(l%overlap), c_sizeof(l%overlap), 'int')
  call field('rmoe_layer_config', 'deterministic', c_loc(l), c_loc(l%deterministic), &
             c_sizeof(l%deterministic), 'int')
  call field('rmoe_layer_config', 'mem_cap', c_loc(l), c_loc(l%mem_cap), c_sizeof(l%mem_cap), 'int')
  call field('rmoe_layer_config', 'check_finite', c_loc(l), c_loc(l%check_finite), c_sizeof(l%check_finite), &
             'int')
  call field('rmoe_layer_config', 'wait_timeout', c_loc(l), c_loc(l%wait_timeout), c_sizeof(l%wait_timeout), &
             'float')
  call field('rmoe_layer_config', 'partitions', c_loc(l), c_loc(l%partitions), c_sizeof(l%partitions), 'int')
  call field('rmoe_layer_config', 'window', c_loc(l), c_loc(l%window), c_sizeof(l%window), 'int')
  call field('rmoe_layer_config', 'stripes', c_loc(l), c_loc(l%stripes), c_sizeof(l%stripes), 'int')

  call struct('rmoe_layer_stats', c_sizeof(s))
  call field('rmoe_layer_stats', 'forward_seconds', c_loc(s), c_loc(s%forward_seconds), &
             c_sizeof(s%forward_seconds), 'float')
  call field('rmoe_layer_stats', 'backward_seconds', c_loc(s), c_loc(s%backward_seconds), &
             c_sizeof(s%backward_seconds), 'float')
  call field('rmoe_layer_stats', 'peak_forward_bytes', c_loc(s), c_loc(s%peak_forward_bytes), &
             c_sizeof(s%peak_forward_bytes), 'int')
  call field('rmoe_layer_stats', 'peak_backward_bytes', c_loc(s), c_loc(s%peak_backward_bytes), &
             c_sizeof(s%peak_backward_bytes), 'int')
  call field('rmoe_layer_stats', 'resident_bytes', c_loc(s), c_loc(s%resident_bytes), &
             c_sizeof(s%resident_bytes), 'int')
  call field('rmoe_layer_stats', 'largest_temporary_bytes', c_loc(s), c_loc(s%largest_temporary_bytes), &
             c_sizeof(s%largest_temporary_bytes), 'int')
  call field('rmoe_layer_stats', 'bytes_sent_forward', c_loc(s), c_loc(s%bytes_sent_forward), &
             c_sizeof(s%bytes_sent_forward), 'int')
  call field('rmoe_layer_stats', 'bytes_sent_backward', c_loc(s), c_loc(s%bytes_sent_backward), &
             c_sizeof(s%bytes_sent_backward), 'int')
  call field('rmoe_layer_stats', 'peak_rss_bytes', c_loc(s), c_loc(s%peak_rss_bytes), &
             c_sizeof(s%peak_rss_bytes), 'int')
  call field('rmoe_layer_stats', 'hops', c_loc(s), c_loc(s%hops), c_sizeof(s%hops), 'int')
  call field('rmoe_layer_stats', 'chunk_rows', c_loc(s), c_loc(s%chunk_rows), c_sizeof(s%chunk_rows), 'int')
  call field('rmoe_layer_stats', 'peak_device_forward_bytes', c_loc(s), c_loc(s%peak_device_forward_bytes), &
             c_sizeof(s%peak_device_forward_bytes), 'int')
  call field('rmoe_layer_stats', 'peak_device_backward_bytes', c_loc(s), c_loc(s%peak_device_backward_bytes), &
             c_sizeof(s%peak_device_backward_bytes), 'int')
  call field('rmoe_layer_stats', 'host_waits_forward', c_loc(s), c_loc(s%host_waits_forward), &
             c_sizeof(s%host_waits_forward), 'int')
  call field('rmoe_layer_stats', 'host_waits_backward', c_loc(s), c_loc(s%host_waits_backward), &
             c_sizeof(s%host_waits_backward), 'int')
  call field('rmoe_layer_stats', 'peak_heap_forward_bytes', c_loc(s), c_loc(s%peak_heap_forward_bytes), &
             c_sizeof(s%peak_heap_forward_bytes), 'int')
  call field('rmoe_layer_stats', 'peak_heap_backward_bytes', c_loc(s), c_loc(s%peak_heap_backward_bytes), &
             c_sizeof(s%peak_heap_backward_bytes), 'int')
  call field('rmoe_layer_stats', 'runtime_forward_bytes', c_loc(s), c_loc(s%runtime_forward_bytes), &
             c_sizeof(s%runtime_forward_bytes), 'int')
  call field('rmoe_layer_stats', 'runtime_backward_bytes', c_loc(s), c_loc(s%runtime_backward_bytes), &
             c_sizeof(s%runtime_backward_bytes), 'int')

  call enum('RMOE_OK', RMOE_OK)
  call enum('RMOE_EINVAL', RMOE_EINVAL)
  call enum('RMOE_ENOMEM', RMOE_ENOMEM)
  call enum('RMOE_EMPI', RMOE_EMPI)
  call enum('RMOE_ESTARPU', RMOE_ESTARPU)
  call enum('RMOE_EMISMATCH', RMOE_EMISMATCH)
  call enum('RMOE_ESTATE', RMOE_ESTATE)
  call enum('RMOE_ENOTSUP', RMOE_ENOTSUP)
  call enum('RMOE_EIO', RMOE_EIO)
  call enum('RMOE_ENONFINITE', RMOE_ENONFINITE)
  call enum('RMOE_EFORMAT', RMOE_EFORMAT)
  call enum('RMOE_EPEER', RMOE_EPEER)
  call enum('RMOE_DISPATCH_ALLTOALL', RMOE_DISPATCH_ALLTOALL)
  call enum('RMOE_DISPATCH_RING_EXPERT', RMOE_DISPATCH_RING_EXPERT)
  call enum('RMOE_DISPATCH_RING_TOKEN', RMOE_DISPATCH_RING_TOKEN)
  call enum('RMOE_DISPATCH_AUTO', RMOE_DISPATCH_AUTO)
  call enum('RMOE_DISPATCH_ALLTOALL_MEGATRON', RMOE_DISPATCH_ALLTOALL_MEGATRON)
  call enum('RMOE_DISPATCH_ALLTOALL_DEEPEP', RMOE_DISPATCH_ALLTOALL_DEEPEP)
  call enum('RMOE_DTYPE_F32', RMOE_DTYPE_F32)
  call enum('RMOE_DTYPE_BF16', RMOE_DTYPE_BF16)
  call enum('RMOE_MEMORY_HOST', RMOE_MEMORY_HOST)
  call enum('RMOE_MEMORY_DEVICE', RMOE_MEMORY_DEVICE)
  call enum('RMOE_RING_PLANNED', RMOE_RING_PLANNED)
  call enum('RMOE_RING_RANK', RMOE_RING_RANK)

contains

  subroutine struct(name, bytes)
    character(len=*), intent(in) :: name
    integer(c_size_t), intent(in) :: bytes
    write(*, '(3a, i0)') 'struct ', name, ' size ', bytes
  end subroutine

  subroutine field(name, member, base, at, bytes, category)
    character(len=*), intent(in) :: name, member, category
    type(c_ptr), intent(in) :: base, at
    integer(c_size_t), intent(in) :: bytes
    integer(c_intptr_t) :: offset
    offset = transfer(at, 0_c_intptr_t) - transfer(base, 0_c_intptr_t)
    write(*, '(5a, i0, a, i0, 2a)') 'field ', name, '.', member, ' offset ', offset, ' size ', bytes, &
      ' kind ', category
  end subroutine

  subroutine enum(name, value)
    character(len=*), intent(in) :: name
    integer(c_int), intent(in) :: value
    write(*, '(3a, i0)') 'enum ', name, ' ', value
  end subroutine

end program layout
