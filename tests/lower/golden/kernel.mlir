module @WeightedSum attributes {gf.level = "kernel"} {
  func.func @main(%graph: !gf.relation<csr, src=S, dst=N, edges=E, index=i64>, %x: tensor<Sxf32>, %w: tensor<Exf32>) -> tensor<Nxf32> {
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
    "func.return"(%out) : (tensor<Nxf32>) -> ()
  }
}
