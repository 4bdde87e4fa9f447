sdy.mesh @mesh = <["i"=2]>
func.func @dialects(%x: tensor<4xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"i"}]>}) -> tensor<4xf32> {
  %0 = chlo.erf %x : tensor<4xf32> -> tensor<4xf32>
  %1 = mhlo.add %0, %x : tensor<4xf32>
  %2 = stablehlo.multiply %1, %1 : tensor<4xf32>
  %3 = sdy.sharding_constraint %2 <@mesh, [{"i"}]> : tensor<4xf32>
  return %3 : tensor<4xf32>
}
