module @WeightedSum attributes {gf.level = "task"} {
  func.func @main(%graph: !gf.relation<csr, src=S, dst=N, edges=E, index=i64>, %x: tensor<Sxf32>, %w: tensor<Exf32>) -> tensor<Nxf32> {
    %e0 = "gf_storage.transfer"(%graph) {
      kind = "page",
      src_tier = "host",
      dst_tier = "host",
      page = 0,
      rows = [0, N]
    } : (!gf.relation<csr, src=S, dst=N, edges=E, index=i64>) -> !gf_storage.event
    %e1 = "gf_storage.transfer"(%x) {
      kind = "page",
      src_tier = "host",
      dst_tier = "host",
      page = 0,
      rows = [0, S]
    } : (tensor<Sxf32>) -> !gf_storage.event
    %e2 = "gf_storage.transfer"(%w) {
      kind = "page",
      src_tier = "host",
      dst_tier = "host",
      page = 0,
      rows = [0, E]
    } : (tensor<Exf32>) -> !gf_storage.event
    %out, %e3 = "gf_task.launch"(%e0, %e1, %e2, %graph, %x, %w) ({
    ^bb0(%graph: !gf.relation<csr, src=S, dst=N, edges=E, index=i64>, %x: tensor<Sxf32>, %w: tensor<Exf32>):
      %out = "gf_kernel.launch"(%graph, %x, %w) ({
      ^bb0(%src_x: f32, %edge_w: f32):
        %message = arith.mulf %src_x, %edge_w : f32
        "gf_kernel.yield"(%message) : (f32) -> ()
      }) {
        coordinate_hierarchy = "compressed-row",
        ordering = "destination-major",
        traversal = "csr-row",
        materializes = [],
        guards = {row_ptr = "validated", col_idx = "in-bounds", max_degree = "dynamic"},
        target = "cpu-llvm",
        threads = 2,
        row_partition = "edge-balanced",
        chunks_per_thread = 16,
        edge_unroll = 4,
        prefetch_distance = 16,
        parallel = "rows",
        input_roles = ["src", "edge"],
        input_names = ["x", "w"],
        reduce_by = "dst",
        reducer = "sum",
        reducer_kind = "builtin",
        reducer_identity = 0.0,
        reducer_state = [[f32]],
        region_kinds = ["edge"]
      } : (!gf.relation<csr, src=S, dst=N, edges=E, index=i64>, tensor<Sxf32>, tensor<Exf32>) -> tensor<Nxf32>
      "gf_task.yield"(%out) : (tensor<Nxf32>) -> ()
    }) {
      task_kind = "interior",
      page = 0,
      num_pages = 1,
      page_rows = [0, N],
      rank = 0,
      num_ranks = 1,
      halo_ranks = [],
      halo_ghosts = [],
      reads = ["graph", "x", "w"],
      writes = ["out"]
    } : (!gf_storage.event, !gf_storage.event, !gf_storage.event, !gf.relation<csr, src=S, dst=N, edges=E, index=i64>, tensor<Sxf32>, tensor<Exf32>) -> (tensor<Nxf32>, !gf_storage.event)
    "gf_storage.release"(%graph, %e3) {tier = "host"} : (!gf.relation<csr, src=S, dst=N, edges=E, index=i64>, !gf_storage.event) -> ()
    "gf_storage.release"(%x, %e3) {tier = "host"} : (tensor<Sxf32>, !gf_storage.event) -> ()
    "gf_storage.release"(%w, %e3) {tier = "host"} : (tensor<Exf32>, !gf_storage.event) -> ()
    %e4 = "gf_storage.join"(%e3) : (!gf_storage.event) -> !gf_storage.event
    "func.return"(%out) : (tensor<Nxf32>) -> ()
  }
}
